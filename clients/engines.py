"""What an inference engine started by a placed rank takes from the reservation: its ports
and, on a CPU build, the cores its workers bind.

Ports. vLLM takes the ports of its own distributed setup upward from ``VLLM_PORT`` (the
first free one at or above it), or from the kernel's ephemeral range without it: two
engines on one node then pick in a race, and a port a trainer's ``MASTER_PORT`` lease
holds is not theirs to know about. A :class:`clients.WorkerGroup` of a component with
``engine: vllm`` therefore leases :data:`ENGINE_PORTS` consecutive ports on each rank's
node before starting it (a lease named after the node, so a rank moved elsewhere leases
there) and sets ``VLLM_PORT`` to the first; and one more for the engine's OpenAI server
(``vllm serve --port``, a command-line argument, not a variable), in
``PLACECTL_SERVER_PORT``. Nothing is asked of the user.

Cores. vLLM's CPU build binds each of an engine's workers to a list of cores
(``VLLM_CPU_OMP_THREADS_BIND``, ``"0-3|4-7"``: one list per worker); left to itself it
binds one NUMA node per worker and refuses tensor parallelism 2 on a one-NUMA machine.
Ray reserves CPU amounts, never particular cores, so the same ``WorkerGroup`` also leases
each rank a run of its node's CPU units, as many as its bundles hold, disjoint from every
other rank's on that node, of any component or reservation
(:mod:`controller.state.leases`), and hands it over in ``PLACECTL_CPU_UNITS`` (``a-b``) and
``PLACECTL_NODE_CPUS``. Which cores those are is known only on the node, so the rank
asks when it starts, before it creates the engine::

    os.environ.update(clients.engines.vllm_environment())
    llm = vllm.LLM(model, tensor_parallel_size=...)

Its units map to the cores the process may run on (unit ``u`` is core ``u`` where Ray's
``CPU`` is the node's core count, as on a real node), split between its engine's
workers. A rank started without a lease (not by ``WorkerGroup``) splits its node's cores
between the component's processes there (``NODE_LOCAL_RANK`` of
``NODE_LOCAL_WORLD_SIZE``): disjoint within the component only. The GPU build ignores the
variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from controller import PlacementError
from controller.planning.ranks import format_ranks
from controller.state.assignments import Assignment
from controller.state.environment import VLLM
from controller.state.leases import cores_of
from controller.state.standbys import STANDBY

ENGINE_PORTS = 16  # vLLM takes 1-3 for one engine (its distributed init, data parallel)
LEASE = "engine"
PORT_VARIABLE = "VLLM_PORT"
BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"
UNITS_VARIABLE, NODE_CPUS_VARIABLE = "PLACECTL_CPU_UNITS", "PLACECTL_NODE_CPUS"
CORES_LEASE = "cores"
SERVER_VARIABLE, SERVER_LEASE = "PLACECTL_SERVER_PORT", "server"


def share_of_cores(cores: Sequence[int], index: int, count: int, workers: int) -> list[list[int]]:
    """Process ``index`` of ``count`` on a node: its run of ``cores`` (sorted, split in
    equal runs, the remainder unused), split between its ``workers``.

    Raises:
        PlacementError: an index out of range, or fewer cores than the node's engines'
            workers need (one each at least); the message gives both numbers.
    """
    if not 0 <= index < count:
        raise PlacementError(
            f"process {index} of {count} on the node: out of range (0-{count - 1})"
        )
    if workers < 1:
        raise PlacementError(f"{workers} engine workers: expected at least 1")
    ordered = sorted(set(cores))
    per_process = len(ordered) // count
    if per_process < workers:
        raise PlacementError(
            f"{len(ordered)} core(s) on this node for {count} engine process(es) of "
            f"{workers} worker(s) each: every worker needs a core of its own; give the "
            "engine fewer workers or its node more cores"
        )
    mine = ordered[index * per_process : (index + 1) * per_process]
    per_worker = len(mine) // workers
    return [mine[w * per_worker : (w + 1) * per_worker] for w in range(workers)]


def bind_string(lists: list[list[int]]) -> str:
    """vLLM's form: the workers' core lists, ``|`` between workers, ranges as ``a-b``."""
    return "|".join(format_ranks(cores) for cores in lists)


def engine_workers(env: dict[str, str]) -> int:
    """An engine rank's workers: one per accelerator it holds (its bundles), else one."""
    held = env.get("PLACECTL_BUNDLE_INDICES", "")
    return len(held.split(",")) if held else 1


def vllm_environment(tensor_parallel_size: int | None = None) -> dict[str, str]:
    """Inside a placed rank of an engine component: the variables its vLLM engine needs
    from the reservation that ``WorkerGroup`` could not set before the rank started
    (the cores, known only on the node). Apply them before creating the engine.

    Args:
        tensor_parallel_size: the engine's workers (default: one per accelerator the
            rank holds).

    Raises:
        PlacementError: not a placectl worker, or too few cores (see
            :func:`share_of_cores`).
    """
    env = os.environ
    missing = [
        k for k in ("PLACECTL_JOB", "NODE_LOCAL_RANK", "NODE_LOCAL_WORLD_SIZE") if k not in env
    ]
    if missing:
        raise PlacementError(
            f"not a placectl worker: {', '.join(missing)} not set in the environment"
        )
    workers = engine_workers(dict(env)) if tensor_parallel_size is None else tensor_parallel_size
    mine = sorted(os.sched_getaffinity(0))
    if UNITS_VARIABLE in env and NODE_CPUS_VARIABLE in env:
        first, _, last = env[UNITS_VARIABLE].partition("-")
        start, end = int(first), int(last or first)
        mine = cores_of(start, end - start + 1, int(env[NODE_CPUS_VARIABLE]), mine)
        lists = share_of_cores(mine, 0, 1, workers)
    else:
        lists = share_of_cores(
            mine, int(env["NODE_LOCAL_RANK"]), int(env["NODE_LOCAL_WORLD_SIZE"]), workers
        )
    return {BIND_VARIABLE: bind_string(lists)}


def engine_environment(
    reservation: Any, component: str, env: dict[str, str] | None
) -> Callable[[Assignment], dict[str, str]] | None:
    """For a :class:`clients.WorkerGroup` of ``component``: what each rank's start adds to
    its environment (``VLLM_PORT`` from a port lease on its node, a port for its engine's
    server in ``PLACECTL_SERVER_PORT``: ``vllm serve --port``, and its core lease), or
    None when the component runs no vLLM engine. The leases are named after the node, so
    a rank moved elsewhere leases there.

    Raises:
        PlacementError: the user's ``env`` sets one of the variables placectl sets from
            these leases (``VLLM_PORT``, ``PLACECTL_SERVER_PORT``, the core variables).
    """
    if reservation.spec.component(component).engine != VLLM:
        return None
    for key in (PORT_VARIABLE, SERVER_VARIABLE, UNITS_VARIABLE, NODE_CPUS_VARIABLE):
        if env and key in env:
            raise PlacementError(
                f"env sets {key}={env[key]!r} for {component!r}, an engine: placectl leases "
                "each rank's engine ports and cores on its node and sets it; remove it"
            )

    def leased(a: Assignment) -> dict[str, str]:
        rank, node = a.placement.rank, a.placement.node_id
        # A standby leases on its held spare, for its bundle; promoted, the leases are the
        # rank's, under the same names (controller.state.standbys.settle_standby_leases).
        at = (a.placement_group_id, a.bundle_index) if a.env.get(STANDBY) == "1" else None
        ports = reservation.lease_ports(
            component, rank, ENGINE_PORTS, True, f"{LEASE}@{node}", standby=at
        )
        server = reservation.lease_ports(
            component, rank, 1, True, f"{SERVER_LEASE}@{node}", standby=at
        )
        cores = reservation.lease_cores(component, rank, f"{CORES_LEASE}@{node}", standby=at)
        last = cores["first"] + cores["count"] - 1
        return {
            PORT_VARIABLE: str(ports[0]),
            SERVER_VARIABLE: str(server[0]),
            UNITS_VARIABLE: f"{cores['first']}-{last}",
            NODE_CPUS_VARIABLE: str(cores["node_cpus"]),
        }

    return leased
