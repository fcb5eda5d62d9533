"""A real local multi-node Ray cluster with fake GPUs, one per test module: a module's own
(its ``cluster`` fixture, for a shape or Ray settings of its own, or one it damages), or
the default one, which the modules that use it share. Those modules run one after
another, first (:func:`pytest_collection_modifyitems`), and each releases what it
reserved (``ctl``); the default cluster is shut down before the first module with a
cluster of its own starts, since one process connects to one Ray cluster at a time.
Starting a cluster costs 10-14 s of CI's two cores; sharing saves six of them.

``scripts/test`` runs the suite in two lanes (pytest-xdist, ``--dist loadfile``, each lane
in network and mount namespaces of its own: ``scripts/_lane_python``): a module runs whole
in one lane, with its cluster; a lane that takes modules of the default cluster starts
one of its own. The order below is the order lanes take modules in."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group_table  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

import clients  # noqa: E402
from clients.testing.local import local_cluster as testing_cluster  # noqa: E402
from controller.state.scheduling import group_handle  # noqa: E402

GPU_NODES = 2
GPUS_PER_NODE = 4


def _uses_default(item) -> bool:
    """Whether ``item`` runs on the default cluster (this file's ``cluster`` fixture)."""
    defs = item._fixtureinfo.name2fixturedefs.get("cluster")
    return bool(defs) and defs[-1].func is _default_cluster


_SHARING: set[str] = set()  # the modules of the default cluster


def _shares(item) -> bool:
    return _module(item) in _SHARING


# The longest modules in the lanes (2-8 minutes each in CI, from its --durations), taken
# right after the default cluster's so that the lanes end together, not one of them
# starting a long module when the other is nearly done.
LONGEST = (
    "test_openrlhf",
    "test_standby",
    "test_autoscaling",
    "test_rlinf",
    "test_secured",
)


def _module(item) -> str:
    return item.nodeid.split("::")[0]


def _rank(item) -> int:
    """Where the item's module starts: the default cluster's first, the longest next."""
    if _shares(item):
        return 0
    name = _module(item).rsplit("/", 1)[-1].removesuffix(".py")
    return 1 + LONGEST.index(name) if name in LONGEST else 1 + len(LONGEST)


def pytest_collection_modifyitems(items):
    here = [i for i in items if i.nodeid.startswith("tests/integration/")]
    _SHARING.update(_module(i) for i in here if _uses_default(i))
    for item in here:
        item.add_marker(pytest.mark.integration)
    # Each module whole and in its order (a stable sort keeps it).
    ordered = sorted(here, key=_rank)
    at = iter(ordered)
    items[:] = [next(at) if i.nodeid.startswith("tests/integration/") else i for i in items]


_DEFAULT: list = []  # (the default cluster's context, the cluster) while it runs


def _default_cluster():
    """Head (no GPUs) + two nodes of 4 fake GPUs and 4 CPUs each, shared."""
    if not _DEFAULT:
        context = local_cluster()
        _DEFAULT.append((context, next(context)))
    yield _DEFAULT[0][1]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if _DEFAULT and (nextitem is None or not _shares(nextitem)):
        context, _ = _DEFAULT.pop()
        context.close()  # the generator's exit: the cluster shut down, Ray disconnected


def local_cluster(gpu_nodes: int = GPU_NODES):
    """A head without GPUs and ``gpu_nodes`` nodes of 4 fake GPUs and 4 CPUs each, with
    this process connected; for a module fixture to yield from."""
    with testing_cluster(gpu_nodes, gpus=GPUS_PER_NODE) as (c, _):
        yield c


def site_cluster(site: str, head: dict, gpu_nodes: int, env: dict | None = None):
    """A local cluster whose processes import from ``tests/integration/<site>`` first (a
    framework's stand-ins) and see ``env``, with the head ``head`` and ``gpu_nodes``
    nodes of 4 fake GPUs and 4 CPUs; yields ``(cluster, nodes)`` and restores the
    environment after. For a module fixture to yield from."""
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    path = [os.path.join(here, site), repo, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**(env or {}), "PYTHONPATH": os.pathsep.join(path)}
    with testing_cluster(gpu_nodes, gpus=GPUS_PER_NODE, head=head, env=env) as (c, nodes):
        yield c, nodes


cluster = pytest.fixture(scope="module", name="cluster")(_default_cluster)


@pytest.fixture(scope="module")
def ctl(cluster):
    controller = clients.connect()
    yield controller
    controller.release_all()


@pytest.fixture(autouse=True)
def _clean(request):
    yield
    if "ctl" in request.fixturenames:
        request.getfixturevalue("ctl").release_all()


def live_groups(prefix: str = "placectl:") -> dict[str, dict]:
    """Placement groups not removed whose name starts with ``prefix``."""
    return {
        gid: info
        for gid, info in placement_group_table().items()
        if info["state"] != "REMOVED" and (info.get("name") or "").startswith(prefix)
    }


def placectl_cli(address: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the ``placectl`` command line against the cluster at ``address`` (with ``env``
    added to this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "clients.cli", *args, "--address", address],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def one_node(placement: str = "0-3", **extra) -> dict:
    """A configuration whose `cluster` group spans head + the GPU nodes."""
    comps = {"actor": placement, **extra}
    return {"num_nodes": 1 + GPU_NODES, "component_placement": comps}


def restart_controller(ctl) -> None:
    """Kill the controller process and wait until Ray has restarted it and it has
    recovered (it answers check_alive before that)."""
    before = ctl.check_alive()
    ray.kill(ctl.handle, no_restart=False)

    def restarted():
        try:
            health = ctl.health()
        except ray.exceptions.RayActorError:
            return False
        return health["incarnation"] != before and health["recovered"]

    wait_for(restarted, timeout=60)


@ray.remote(num_cpus=0, max_calls=0)
def ray_ids():
    """What Ray gives a task in a bundle: its accelerator ids (no placectl env here)."""
    return sorted(int(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"])


def bundle_ids(group_id: str, bundle_index: int) -> list[int]:
    """Ask Ray, from the driver, which device a bundle holds."""
    return ray.get(
        ray_ids.options(
            num_gpus=0.0001,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group_handle(group_id), placement_group_bundle_index=bundle_index
            ),
        ).remote()
    )


def remove(cluster, node_id: str) -> None:
    """Remove a node abruptly: every process killed, Ray not told."""
    node = next(n for n in cluster.list_all_nodes() if n.node_id == node_id)
    cluster.remove_node(node, allow_graceful=False)


def held_spare(res) -> str:
    """The node of the one spare the reservation holds, once it holds it."""
    info = wait_for(lambda: (i := res.refresh()).spares and i, timeout=60)
    (spare,) = info.spares
    return spare.node_id
