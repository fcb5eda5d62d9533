"""RLinf on placectl: RLinf's own workers, launched by RLinf, in a placectl reservation.

Written against rlinf 0.3.0 (``RLINF_VERSION``); imported only when used, and rlinf is not
a dependency of placectl. An RLinf driver keeps its ``Worker`` subclasses, its
``create_group(...).launch(...)`` calls and all of RLinf's machinery (its ``Cluster`` with
node probes and manager actors, ``WorkerGroup`` dispatch, channels, collective send and
recv). Two things change::

    cluster = ReservedCluster("grpo", cluster_cfg=cfg.cluster)      # was Cluster(...)
    actor = ActorWorker.create_group(cfg).launch(
        cluster, placement_strategy=cluster.get_strategy("actor"), name="ActorGroup"
    )

``ReservedCluster`` reserves the same ``cluster:`` block with placectl (idempotently: a
restarted driver gets the kept reservation) and is RLinf's ``Cluster`` otherwise. Every
worker then starts in placectl's bundle for its rank, asks Ray for its placectl share of
the accelerator, and gets RLinf's environment built by RLinf's own code.

How the two agree, and where they cannot:

* **Node order.** RLinf numbers nodes itself: by ``RLINF_NODE_RANK`` when every node sets
  it, else the driver's node first, then by accelerator type and IP as a string. Where no
  node sets it, a ``ReservedCluster`` numbers them the way that variable would have: the
  reservation's node ``k`` is RLinf's node ``k`` (the nodes outside it come after, in
  RLinf's order), so ``CLUSTER_NODE_RANK`` is RLinf's rank of the Ray node a worker runs
  on and equals placectl's, also after a repair moved a slot to a spare node. Where every
  node sets it, RLinf's order stands and each rank is checked: a rank that RLinf would
  put on another Ray node than placectl did is refused, naming both, with the remedy.
* **Devices.** RLinf sets ``CUDA_VISIBLE_DEVICES`` itself (with Ray's NOSET switch) to its
  node-local accelerator indexes and asks Ray for no GPU. A rank is refused when those
  indexes are not the physical accelerators Ray granted its bundle (another job holds
  the node's first accelerators: RLinf numbers from 0). The worker asks Ray for its
  share, so Ray's accounting sees the accelerators RLinf uses.
* **Ranks and ports.** RLinf's ``Worker`` sets ``LOCAL_RANK`` (0 when isolated, else the
  device id) and ``MASTER_ADDR``/``MASTER_PORT`` (rank 0's node and a port it picks)
  itself; placectl's leased master port is not used. The ``PLACECTL_*`` variables are
  added, so ``clients.current()`` works inside RLinf workers.
* **Failures.** RLinf's workers and manager actors belong to the driver, and its managers
  cannot take back a single relaunched rank. After a node loss (once the reservation is
  repaired) or a driver restart, a new driver process creates a new ``ReservedCluster``
  and relaunches the groups into the kept reservation; its constructor waits until the
  reservation is ready.

What this module relies on in RLinf, and what breaks if RLinf changes it:

* ``rlinf.scheduler.cluster.cluster.NodeProbe`` is looked up when a ``Cluster`` starts;
  it is replaced by a subclass for the duration of the constructor, whose
  ``_sort_nodes`` gives the probed ``NodeInfo`` objects their ``node_rank``;
* ``Cluster.__new__``/``_instance``/``_has_initialized`` make it a process singleton;
* ``WorkerGroup._create_workers`` calls ``placement_strategy.get_placement(cluster,
  isolate)`` once, then ``cluster.allocate(...)`` once per rank, in the same thread;
* ``Cluster.allocate``'s arguments, and the helpers used to build the same runtime
  environment RLinf builds: ``merge_worker_env_vars``, ``get_path_env_merge_mode``,
  ``_combine_ray_runtime_env``, ``_job_code_sync_fragment_for_child_runtime_env``,
  ``_strip_sync_roots_from_pythonpath``, ``modify_profile_context``,
  ``get_profiling_env_vars_for_worker``, and the ``_nodes``, ``_cluster_cfg``,
  ``_ray_code_sync_fragment``, ``_runtime_code_sync_strip_roots``,
  ``_distributed_log_collector`` attributes;
* ``ComponentPlacement(config, cluster).get_strategy(name)`` and RLinf's ``Placement``
  fields (``rank``, ``cluster_node_rank``, ``local_accelerator_rank``,
  ``local_hardware_ranks``, ``visible_accelerators``).
"""

from __future__ import annotations

import threading
from typing import Any

from clients.integrations import RLINF_VERSION, rlinf_missing, warn_if_not
from clients.session import DEFAULT_NAME, connect
from controller.errors import PlacementError
from controller.planning.spec import load_spec
from controller.state.assignments import Assignment

try:
    import ray
    import rlinf  # noqa: F401
    from omegaconf import DictConfig, OmegaConf
    from rlinf.scheduler.cluster import cluster as _cluster_module
    from rlinf.scheduler.cluster.cluster import Cluster
    from rlinf.scheduler.cluster.node import NodeProbe
    from rlinf.scheduler.placement import ComponentPlacement, PlacementStrategy

    from clients.integrations.rlinf_agreement import ReservationOrder, check_rank, ordering
except ImportError as e:  # pragma: no cover - exercised only without rlinf
    raise rlinf_missing(e) from None


warn_if_not("rlinf", RLINF_VERSION, "RLinf")


class ReservedCluster(Cluster):
    """RLinf's ``Cluster``, backed by a placectl reservation of the same ``cluster:`` block.

    Create it where RLinf's ``Cluster`` is created (before anything starts Ray: RLinf
    refuses otherwise). It reserves ``cluster_cfg`` for ``job`` (an existing reservation
    of the job with the same block is kept, so a restarted driver gets its bundles back),
    waits until it is ready, starts RLinf's cluster with the reservation's node order, and
    is then RLinf's ``Cluster`` in every respect but one: a worker launched with a
    strategy from :meth:`get_strategy` starts in its placectl bundle.

    Args:
        job: the placectl job name.
        cluster_cfg: RLinf's ``cluster:`` block (DictConfig or dict).
        timeout_s: how long to wait for the reservation (and for its repair).
        controller: the placectl controller's name.
        distributed_log_dir: passed to RLinf's ``Cluster``.

    Raises:
        PlacementError: the block does not plan, an RLinf cluster exists in this process
            already, or the reservation cannot be met within ``timeout_s``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> ReservedCluster:
        if cls.__dict__.get("_instance") is None and Cluster.__dict__.get("_instance"):
            raise PlacementError(
                "an RLinf Cluster exists in this process already: create the "
                "ReservedCluster instead of it (RLinf's Cluster is one per process)"
            )
        return super().__new__(cls)

    def __init__(
        self,
        job: str | None = None,
        cluster_cfg: Any = None,
        timeout_s: float = 300.0,
        controller: str = DEFAULT_NAME,
        distributed_log_dir: str | None = None,
    ) -> None:
        if self._has_initialized:
            return
        if not isinstance(job, str) or not job:
            raise PlacementError(f"job {job!r}: expected the placectl job name, a string")
        if cluster_cfg is None:
            raise PlacementError("cluster_cfg: expected RLinf's cluster: block, got None")
        if not isinstance(cluster_cfg, DictConfig):
            cluster_cfg = OmegaConf.create(cluster_cfg)
        self.job = job
        self._block = cluster_cfg
        self._spec = load_spec(cluster_cfg)  # refuse a bad block before Ray starts
        self.timeout_s = timeout_s
        self._controller_name = controller
        self._launching: dict[int, _Launch] = {}
        self._placements: ComponentPlacement | None = None
        self.reservation: Any = None
        ordering.cluster = self
        _cluster_module.NodeProbe = ReservationOrder
        try:
            super().__init__(cluster_cfg=cluster_cfg, distributed_log_dir=distributed_log_dir)
        finally:
            _cluster_module.NodeProbe = NodeProbe
            ordering.cluster = None
        if self.reservation is None:  # RLinf's NodeProbe was not used: attach now
            self.reserve()
        Cluster._instance = self  # RLinf code calling Cluster() in this driver gets this one

    def reserve(self) -> None:
        """Reserve the block for the job (or find it reserved) and wait until it is ready."""
        if self.reservation is None:
            ctl = connect(name=self._controller_name)
            self.reservation = ctl.reserve(self.job, self._spec, timeout_s=self.timeout_s)
        self.reservation.wait_ready(timeout=self.timeout_s)

    def number_nodes(self, nodes: list[Any]) -> None:
        """Give RLinf's probed nodes (``NodeInfo``) their ranks: the reservation's node
        ``k`` is rank ``k``, the rest follow in RLinf's order (accelerator type, then
        IP). Called by RLinf's node probe while this cluster starts."""
        record = self.reservation.controller.record(self.job)
        rank_of = {s.node_id: s.node_rank for s in record.slots}
        probed = {n.ray_id for n in nodes}
        missing = sorted(set(rank_of) - probed)
        if missing:
            raise PlacementError(
                f"reservation {self.job!r} holds node(s) {', '.join(missing)} that RLinf's "
                "probe did not find alive; wait_ready() and start the driver again"
            )
        kinds: dict[str, int] = {}
        rest = [n for n in nodes if n.ray_id not in rank_of]
        rest.sort(key=lambda n: (kinds.setdefault(str(n.accelerator_type), len(kinds)), n.node_ip))
        used = sorted(set(rank_of.values()))
        if used != list(range(len(used))):
            raise PlacementError(
                f"reservation {self.job!r} holds node ranks {used}; RLinf needs them "
                f"contiguous from 0"
            )
        for n in nodes:
            if n.ray_id in rank_of:
                n.node_rank = rank_of[n.ray_id]
        for i, n in enumerate(rest):
            n.node_rank = len(used) + i
        driver = ray.get_runtime_context().get_node_id()
        if len(nodes) > self._spec.num_nodes and driver not in rank_of:
            ips = ", ".join(f"{s.node_ip} ({s.node_id[:8]})" for s in record.slots)
            raise PlacementError(
                f"the driver runs on node {driver[:8]}, outside reservation {self.job!r}: "
                f"RLinf needs its driver on one of the job's nodes ({ips})"
            )

    def get_strategy(
        self, component: str, strategy: PlacementStrategy | None = None, config: Any = None
    ) -> ReservedStrategy:
        """The placement strategy that launches ``component``'s ranks in the reservation.

        Args:
            component: a component of the ``cluster:`` block (``actor``, ``rollout``...).
            strategy: RLinf's strategy for it, when the driver built its own (a
                ``HybridComponentPlacement``'s); default: RLinf's ``ComponentPlacement``
                of the block.
            config: the whole RLinf config, when ``strategy`` is not given and RLinf's
                placement needs more than the ``cluster:`` block.
        """
        self._spec.component(component)  # an unknown name: one line naming the known ones
        if strategy is None:
            if config is not None:
                strategy = ComponentPlacement(config, self).get_strategy(component)
            else:
                if self._placements is None:
                    whole = OmegaConf.create({"cluster": self._block})
                    self._placements = ComponentPlacement(whole, self)
                strategy = self._placements.get_strategy(component)
        return ReservedStrategy(self, component, strategy)

    def _expect(self, component: str, placements: list[Any]) -> None:
        """Check RLinf's placements of ``component`` against the reservation and hold
        each rank's assignment for the ``allocate`` call that follows."""
        assignments = self.reservation.assignments(component)
        if len(placements) != len(assignments):
            raise PlacementError(
                f"{component}: RLinf places {len(placements)} processes, reservation "
                f"{self.job!r} holds {len(assignments)}"
            )
        by_rank = {}
        for p in placements:
            a = assignments[p.rank]
            check_rank(self, component, p, a)
            by_rank[p.rank] = (p.cluster_node_rank, a)
        self._launching[threading.get_ident()] = _Launch(component, by_rank)

    def allocate(
        self,
        cls: type,
        worker_name: str,
        worker_rank: int,
        node_rank: int,
        max_concurrency: int | None,
        env_vars: dict,
        node_group_label: str,
        disable_distributed_log: bool,
        cls_args: tuple,
        cls_kwargs: dict,
    ) -> Any:
        """Start one RLinf worker in its placectl bundle (RLinf's ``allocate`` pins it to
        a node with a hard affinity and no resources)."""
        launch = self._launching.get(threading.get_ident())
        if launch is None or worker_rank not in launch.ranks:
            raise PlacementError(
                f"worker {worker_name!r} launched on ReservedCluster {self.job!r} without "
                "its strategy: pass placement_strategy=cluster.get_strategy('<component>')"
            )
        expected_node, a = launch.ranks.pop(worker_rank)
        if not launch.ranks:
            del self._launching[threading.get_ident()]
        if node_rank != expected_node:
            raise PlacementError(
                f"{launch.component}:{worker_rank}: RLinf allocates on node rank {node_rank}, "
                f"its strategy placed it on {expected_node}"
            )
        options = a.actor_options()
        options["runtime_env"] = self._runtime_env(
            worker_name, node_rank, node_group_label, env_vars, a
        )
        options["name"] = worker_name
        if max_concurrency is not None:
            options["max_concurrency"] = max_concurrency
        actor = ray.remote(cls).options(**options).remote(*cls_args, **cls_kwargs)
        if self._distributed_log_collector is not None and not disable_distributed_log:
            self._distributed_log_collector.register_worker(
                worker_name=worker_name, rank=worker_rank, actor_handle=actor
            )
        return actor

    def _runtime_env(
        self,
        worker_name: str,
        node_rank: int,
        label: str,
        env_vars: dict,
        a: Assignment,
    ) -> dict:
        """The runtime environment RLinf gives this worker on this node, plus the
        ``PLACECTL_*`` variables of its assignment."""
        node = self._nodes[node_rank]
        group = self.get_node_group(label)
        mode = self.get_path_env_merge_mode(node.env_vars.copy())
        env = self.merge_worker_env_vars(
            node.env_vars.copy(), group.get_node_env_vars(node_rank), mode
        )
        env = self.merge_worker_env_vars(env, env_vars, mode)
        profiling = self._cluster_cfg.profiling if self._cluster_cfg is not None else None
        python = group.get_node_python_interpreter_path(node_rank) or node.python_interpreter_path
        python = self.modify_profile_context(
            python_interpreter_path=python, worker_name=worker_name, profiling_cfg=profiling
        )
        extra = self.get_profiling_env_vars_for_worker(
            worker_name=worker_name, profiling_cfg=profiling
        )
        if extra:
            env = self.merge_worker_env_vars(env, extra, mode)
        if self._runtime_code_sync_strip_roots:
            env = Cluster._strip_sync_roots_from_pythonpath(
                env, self._runtime_code_sync_strip_roots
            )
        env.update({k: v for k, v in a.env.items() if k.startswith("PLACECTL_")})
        return Cluster._combine_ray_runtime_env(
            Cluster._job_code_sync_fragment_for_child_runtime_env(self._ray_code_sync_fragment),
            {"py_executable": python, "env_vars": env},
        )


class _Launch:
    """One ``launch`` in progress: its component and the ranks still to allocate."""

    def __init__(self, component: str, ranks: dict[int, tuple[int, Assignment]]) -> None:
        self.component = component
        self.ranks = ranks


class ReservedStrategy(PlacementStrategy):
    """RLinf's strategy for one component, checked against the reservation: each rank
    must land on the Ray node and devices placectl holds for it."""

    def __init__(
        self, cluster: ReservedCluster, component: str, strategy: PlacementStrategy
    ) -> None:
        super().__init__()
        self.cluster = cluster
        self.component = component
        self.strategy = strategy

    def get_placement(self, cluster: Any, isolate_accelerator: bool = True) -> list[Any]:
        if cluster is not self.cluster:
            raise PlacementError(
                f"the strategy of {self.cluster.job}/{self.component} launches on the "
                "ReservedCluster it came from; pass that cluster to launch()"
            )
        placements = self.strategy.get_placement(cluster, isolate_accelerator)
        self.cluster._expect(self.component, placements)
        return placements


__all__ = ["RLINF_VERSION", "ReservedCluster", "ReservedStrategy"]
