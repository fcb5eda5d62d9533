"""load_spec: every input form, every structural error naming its key path."""

import pathlib

import pytest

from controller import ClusterSpec, PlacementError, SpecError, load_spec

EXAMPLES = pathlib.Path(__file__).parents[2] / "scripts" / "examples"

BLOCK = {"num_nodes": 2, "component_placement": {"actor,rollout": "0-7"}}


def test_dict_with_and_without_cluster_key_mean_the_same():
    assert load_spec(BLOCK) == load_spec({"cluster": BLOCK})


def test_yaml_text_path_and_pathlike(tmp_path):
    text = "cluster:\n  num_nodes: 2\n  component_placement:\n    actor,rollout: 0-7\n"
    f = tmp_path / "conf.yaml"
    f.write_text(text)
    expected = load_spec(BLOCK)
    assert load_spec(text) == expected
    assert load_spec(str(f)) == expected
    assert load_spec(f) == expected


def test_omegaconf_dictconfig():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"cluster": BLOCK, "runner": {"x": "${cluster.num_nodes}"}})
    assert load_spec(cfg) == load_spec(BLOCK)


def test_spec_passes_through():
    spec = load_spec(BLOCK)
    assert load_spec(spec) is spec


def test_normalised_form():
    spec = load_spec(BLOCK)
    assert isinstance(spec, ClusterSpec)
    assert [c.name for c in spec.components] == ["actor", "rollout"]
    assert {c.key for c in spec.components} == {"actor,rollout"}
    assert spec.components[0].node_groups == ["cluster"]
    assert spec.ports.low == 20000 and spec.ports.high == 29999
    assert spec.accelerator == "GPU" and spec.cpus_per_accelerator == 1.0


def test_every_example_loads():
    for f in sorted(EXAMPLES.glob("*.yaml")):
        if f.name.endswith("_nodes.yaml"):
            continue
        assert load_spec(f).components, f


def test_full_form_with_extensions():
    spec = load_spec(
        """
cluster:
  num_nodes: 3
  accelerator: NPU
  cpus_per_accelerator: 2
  ports: {low: 30000, high: 30100}
  node_groups:
    - label: a800
      node_ranks: 0-1
      env_configs:
        - node_ranks: 1
          env_vars: [{NCCL_SOCKET_IFNAME: eth0}, {DEBUG: 1}]
          python_interpreter_path: /opt/venv/bin/python3
    - label: spare
      selector: {ray.io/accelerator-type: A800}
      count: 2
  component_placement:
    inference:
      node_group: [a800]
      placement: 0-3:0-7
      capture_child_tasks: true
      accelerator_share: 0.5
      isolate: false
"""
    )
    assert spec.accelerator == "NPU"
    a800, spare = spec.node_groups
    assert a800.node_ranks == [0, 1]
    assert a800.env_configs[0].node_ranks == [1]
    assert a800.env_configs[0].env_vars == {"NCCL_SOCKET_IFNAME": "eth0", "DEBUG": "1"}
    assert spare.floating and spare.count == 2 and spare.node_ranks is None
    inf = spec.component("inference")
    assert inf.capture_child_tasks and inf.accelerator_share == 0.5 and not inf.isolate


def test_node_group_as_comma_string_or_list():
    groups = [{"label": "a", "node_ranks": 0}, {"label": "b", "node_ranks": 1}]
    for value in ("b,a", ["b", "a"]):
        spec = load_spec(
            {
                "num_nodes": 2,
                "node_groups": groups,
                "component_placement": {"x": {"node_group": value, "placement": 0}},
            }
        )
        assert spec.component("x").node_groups == ["b", "a"]


def test_numeric_labels_are_strings():
    spec = load_spec(
        "cluster:\n  num_nodes: 1\n  node_groups: [{label: 4090, node_ranks: 0}]\n"
        "  component_placement: {x: {node_group: 4090, placement: 0}}\n"
    )
    assert spec.node_groups[0].label == "4090"
    assert spec.component("x").node_groups == ["4090"]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({**BLOCK, "colour": 1}, "cluster: unknown key 'colour'; allowed keys: num_nodes"),
        ({"component_placement": {"a": 0}}, "cluster.num_nodes: required key is missing"),
        ({"num_nodes": 2}, "cluster.component_placement: required key is missing"),
        ({**BLOCK, "num_nodes": "2"}, "cluster.num_nodes: expected `int`, got `str`"),
        ({**BLOCK, "num_nodes": True}, "cluster.num_nodes: expected `int`, got `bool`"),
        ({**BLOCK, "num_nodes": 0}, "cluster.num_nodes 0: must be 1-100000"),
        ({**BLOCK, "num_nodes": 10**9}, "cluster.num_nodes 1000000000: must be 1-100000"),
        ({**BLOCK, "ports": {"low": 80}}, "cluster.ports.low 80: must be 1024-65535"),
        ({**BLOCK, "ports": {"low": 3000, "high": 2000}}, "low must be <= high"),
        ({**BLOCK, "ports": {"lo": 3000}}, "cluster.ports: unknown key 'lo'; allowed keys: low"),
        ({**BLOCK, "cpus_per_accelerator": -1}, "cpus_per_accelerator -1.0: must be >= 0"),
        ({**BLOCK, "accelerator": "G PU"}, "cluster.accelerator 'G PU'"),
        (
            {**BLOCK, "node_groups": [{"label": "a", "node_ranks": 0}, {"label": "b"}]},
            "cluster.node_groups[1].node_ranks: required key is missing",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "a", "node_ranks": 5}]},
            "cluster.node_groups[0].node_ranks '5': rank 5 is out of range (0-1)",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "a", "node_ranks": [0]}]},
            "cluster.node_groups[0].node_ranks: expected `int | str | null`, got `array`",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "a", "node_ranks": 0, "color": "x"}]},
            "cluster.node_groups[0]: unknown key 'color'; allowed keys: label, node_ranks",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "node", "node_ranks": 0}]},
            "'cluster' and 'node' are reserved labels",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "a", "node_ranks": 0}] * 2},
            "label 'a' is defined twice",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "f", "node_ranks": 0, "count": 2}]},
            "give either node_ranks or selector with count, not both",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "f", "selector": {"a": "b"}}]},
            "a floating group needs both a non-empty selector and count",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "f", "selector": {"a": "b"}, "count": 0}]},
            "cluster.node_groups[0].count 0: must be >= 1",
        ),
        (
            {
                **BLOCK,
                "node_groups": [
                    {"label": "a", "node_ranks": 0, "env_configs": [{"node_ranks": 1}]}
                ],
            },
            "cluster.node_groups[0].env_configs[0].node_ranks 1: nodes [1] are not in group 'a'",
        ),
        (
            {
                **BLOCK,
                "node_groups": [
                    {"label": "a", "node_ranks": 0, "env_configs": [{"env_vars": [{"1X": 1}]}]}
                ],
            },
            "'1X' is not a valid environment variable name",
        ),
        (
            {
                **BLOCK,
                "node_groups": [
                    {
                        "label": "a",
                        "node_ranks": 0,
                        "env_configs": [{"env_vars": [{"A": 1, "B": 2}]}],
                    }
                ],
            },
            "env_vars[0]: each entry maps one name to one value",
        ),
        (
            {**BLOCK, "node_groups": [{"label": "r", "node_ranks": 0, "hardware": {}}]},
            "cluster.node_groups[0].hardware.type: required key is missing",
        ),
        (
            {**BLOCK, "component_placement": {"a": {"placement": 0, "nodegroup": "x"}}},
            "cluster.component_placement.a: unknown key 'nodegroup'; allowed keys: placement",
        ),
        (
            {**BLOCK, "component_placement": {"a": {"node_group": "x"}}},
            "cluster.component_placement.a.placement: required key is missing",
        ),
        (
            {**BLOCK, "component_placement": {"a": [0, 1]}},
            "cluster.component_placement.a: expected `int | str | object`, got `array`",
        ),
        (
            {**BLOCK, "component_placement": {"a": {"placement": 0, "node_group": "zz"}}},
            "cluster.component_placement.a.node_group: unknown node group 'zz'",
        ),
        (
            {**BLOCK, "component_placement": {"a": {"placement": 0, "node_group": "cluster,"}}},
            "empty node group label",
        ),
        (
            {**BLOCK, "component_placement": {"a,b": 0, "b": 1}},
            "component 'b' appears under both 'a,b' and 'b'",
        ),
        (
            {**BLOCK, "component_placement": {"a b": 0}},
            "component name 'a b' must use letters",
        ),
        (
            {**BLOCK, "component_placement": {"a": {"placement": 0, "accelerator_share": 1.5}}},
            "accelerator_share 1.5: must be in (0, 1]",
        ),
        (
            {**BLOCK, "component_placement": {"a": {"placement": 0, "isolate": "no"}}},
            "cluster.component_placement.a.isolate: expected `bool | null`, got `str`",
        ),
        (
            {**BLOCK, "component_placement": {"a": "0-3:0-2:1"}},
            "cluster.component_placement.a '0-3:0-2:1': unexpected ':'",
        ),
        (
            {**BLOCK, "component_placement": {"rollout": {"placement": 0, "on_loss": "skip"}}},
            "cluster.component_placement.rollout.on_loss 'skip': expected one of repair, continue",
        ),
        (
            {**BLOCK, "component_placement": {"actor": {"placement": 0, "on_loss": "continue"}}},
            "'actor' is a trainer whose ranks form one collective",
        ),
        (  # one key, two components: the trainer's refusal holds for the pair
            {
                **BLOCK,
                "component_placement": {"actor,rollout": {"placement": 0, "on_loss": "continue"}},
            },
            "cluster.component_placement.actor,rollout.on_loss continue: 'actor' is a trainer",
        ),
        (
            {
                **BLOCK,
                "component_placement": {
                    "rollout": {
                        "placement": "0-1",
                        "on_loss": "continue",
                        "topology": {"segment": 2},
                    }
                },
            },
            "its topology makes groups of 2 ranks that work together",
        ),
        (
            {**BLOCK, "component_placement": {"rollout": {"placement": 0, "take_spares": True}}},
            "cluster.component_placement.rollout.take_spares: only with on_loss: continue "
            "(got on_loss 'repair'",
        ),
        (
            {**BLOCK, "component_placement": {"rollout": {"placement": 0, "take_spares": "y"}}},
            "cluster.component_placement.rollout.take_spares",
        ),
    ],
)
def test_errors_name_the_key_path(conf, message):
    with pytest.raises(PlacementError) as info:
        load_spec(conf)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("cluster: [", "configuration is not valid YAML at line 1"),
        ("/no/such/conf.yaml", "cannot read configuration '/no/such/conf.yaml'"),
        ("just a string", "cluster: expected a mapping"),
        (42, "cluster: expected a mapping"),
        ({"cluster": None}, "cluster: expected a mapping"),
    ],
)
def test_unreadable_input(source, message):
    with pytest.raises(SpecError) as info:
        load_spec(source)
    assert message in str(info.value)


def test_on_loss_continue_is_kept_for_components_whose_ranks_work_alone():
    spec = load_spec(
        {
            "num_nodes": 2,
            "component_placement": {
                "actor": "0-1",
                "rollout": {"placement": "2-3", "on_loss": "continue"},
            },
        }
    )
    assert spec.component("rollout").runs_short
    assert not spec.component("actor").runs_short  # the default: repair before going on
    assert not spec.component("rollout").take_spares  # the default: leave them to standbys


def test_rollout_may_run_short_and_keep_standbys_for_its_replacements():
    spec = load_spec(
        {
            "num_nodes": 3,
            "spares": 2,
            "component_placement": {
                "actor": {"placement": "0-1", "standby": True},
                "rollout": {"placement": "2-3", "on_loss": "continue", "standby": True},
            },
        }
    )
    rollout = spec.component("rollout")
    assert rollout.runs_short and rollout.standby


def test_equal_meaning_gives_equal_specs():
    a = load_spec("cluster: {num_nodes: 2, component_placement: {actor: '0-3'}}")
    b = load_spec({"num_nodes": 2, "component_placement": {"actor": {"placement": "0-3"}}})
    assert a == b


def test_oversized_inputs_are_refused_with_the_limit():
    with pytest.raises(SpecError, match="more than the limit of 1048576"):
        load_spec("cluster: {num_nodes: 1, component_placement: {a: 0}}\n" + "#" * (1 << 20))
    many = {f"c{i}": 0 for i in range(300)}
    with pytest.raises(SpecError, match="300 entries, more than 256"):
        load_spec({"num_nodes": 1, "component_placement": many})
    wide = {",".join(f"c{i}" for i in range(300)): 0}
    with pytest.raises(SpecError, match="more than 256 components"):
        load_spec({"num_nodes": 1, "component_placement": wide})
