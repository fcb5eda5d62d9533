"""Property-based tests: valid strings always yield a consistent plan, and no input
ever raises anything but PlacementError."""

import contextlib

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controller import ClusterView, ComponentPlacement, PlacementError, load_spec

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def valid_layouts(draw):
    """A uniform cluster and a placement string that is valid on it by construction."""
    nodes = draw(st.integers(1, 4))
    gpus = draw(st.integers(1, 8))
    total = nodes * gpus
    segments = []  # (resource_start, resource_end, n_processes, mode)
    pos = draw(st.integers(0, total - 1))
    while pos < total and len(segments) < 5:
        mode = draw(st.sampled_from(["implicit", "share", "multi"]))
        if mode == "multi":
            k = draw(st.sampled_from(_divisors(gpus)))
            pos += (-pos) % k  # align so a process's block stays on one node
            if pos + k > total:
                break
            procs = draw(st.integers(1, (total - pos) // k))
            segments.append((pos, pos + k * procs - 1, procs, mode))
            pos += k * procs
        else:
            length = draw(st.integers(1, total - pos))
            k = draw(st.integers(1, 3)) if mode == "share" else 1
            segments.append((pos, pos + length - 1, length * k, mode))
            pos += length
        pos += draw(st.integers(0, 2))
    assume(segments)
    explicit = all(mode != "implicit" for *_, mode in segments)
    starts, rank = [], 0
    for *_, n, _mode in segments:
        starts.append(rank)
        rank += n
    if explicit and draw(st.booleans()):
        # explicit rank blocks may be listed in any order across segments
        order = draw(st.permutations(range(len(segments))))
        blocks, rank = {}, 0
        for i in order:
            blocks[i] = rank
            rank += segments[i][2]
        starts = [blocks[i] for i in range(len(segments))]
    parts = []
    for (rs, re_, n, mode), start in zip(segments, starts, strict=True):
        res = f"{rs}-{re_}" if re_ > rs or draw(st.booleans()) else f"{rs}"
        if mode == "implicit" and not explicit:
            parts.append(res)
        else:
            parts.append(f"{res}:{start}-{start + n - 1}")
    return ClusterView.uniform(nodes, gpus), nodes, ",".join(parts), sum(s[2] for s in segments)


@SETTINGS
@given(valid_layouts())
def test_valid_strings_place_every_rank_once_on_one_node(layout):
    view, nodes, placement, expected = layout
    cp = ComponentPlacement({"num_nodes": nodes, "component_placement": {"c": placement}}, view)
    ps = cp.placements("c")
    assert [p.rank for p in ps] == list(range(expected))
    assert all(p.world_size == expected for p in ps)
    gpus = view.nodes[0].num_gpus
    for p in ps:
        assert {r // gpus for r in p.resource_ranks} == {p.node_rank}
        assert p.cuda_visible_devices == [r % gpus for r in p.resource_ranks]
        assert 0 <= p.local_rank < p.local_world_size
    per_node = {}
    for p in ps:
        per_node.setdefault(p.node_rank, []).append(p.local_rank)
    for ranks in per_node.values():
        assert sorted(ranks) == list(range(len(ranks)))
    for use in cp.accelerator_uses():
        assert use.total <= 1.0 + 1e-9


GARBAGE = st.text(alphabet="0123456789-:, \tallAx", max_size=24)


@SETTINGS
@given(GARBAGE, st.integers(1, 3), st.integers(0, 4))
def test_garbage_strings_raise_only_placement_error(text, nodes, gpus):
    with contextlib.suppress(PlacementError):
        ComponentPlacement(
            {"num_nodes": nodes, "component_placement": {"c": text}},
            ClusterView.uniform(nodes, gpus),
        )


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10)
    | st.floats(allow_nan=True)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "num_nodes",
        "component_placement",
        "node_groups",
        "ports",
        "accelerator",
        "cpus_per_accelerator",
        "label",
        "node_ranks",
        "hardware",
        "placement",
        "node_group",
        "selector",
        "count",
        "env_configs",
        "env_vars",
        "accelerator_share",
        "isolate",
    ]
)
CONFIGS = st.recursive(
    JSON,
    lambda inner: st.dictionaries(KEYS, inner, max_size=5) | st.lists(inner, max_size=3),
    max_leaves=20,
)


@SETTINGS
@given(CONFIGS)
def test_garbage_configs_raise_only_placement_error(config):
    try:
        spec = load_spec({"cluster": config})
        ComponentPlacement(spec, ClusterView.uniform(spec.num_nodes, 2))
    except PlacementError:
        pass


@SETTINGS
@given(st.text(max_size=60))
def test_garbage_yaml_raises_only_placement_error(text):
    with contextlib.suppress(PlacementError):
        load_spec(text if "\n" in text else text + "\n")
