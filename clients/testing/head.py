"""A local Ray cluster whose head can be restarted: Ray's GCS fault tolerance on a store
of its own, either of the two Ray 2.60 has:

* :class:`RedisServer`: an external Redis (``RAY_REDIS_ADDRESS``), the store a head that
  moves to another machine needs. The server binds to 127.0.0.1 on a free port, keeps
  nothing on disk, and is stopped by its pid.
* :class:`RocksStore`: the GCS's embedded RocksDB (``RAY_gcs_storage=rocksdb``, its files
  in ``RAY_gcs_storage_path``), for a head that restarts in place: no server to run, the
  tables on the head's own disk.

Used by the head-restart tests, ``scripts/bench/bench_head.py`` and
``scripts/chaos/chaos.py``. The head's GCS listens on a fixed port so that the worker
raylets, the workers and the drivers find the new GCS where the old one was.

Two faults, as a real head has them:

* :meth:`FaultTolerantCluster.restart_gcs`: the GCS process alone dies and comes back
  (the head's raylet, and everything on it, lives);
* :meth:`FaultTolerantCluster.restart_head`: every process of the head node dies (its GCS,
  its raylet and the actors on it, the controller among them) and a new head node starts
  against the same store, as after a reboot of the head machine. A driver connected to
  the head's raylet dies with it: the caller disconnects first and connects again after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import ray
from ray.cluster_utils import Cluster

from clients.testing.local import attach_drivers_to_the_head, started
from controller.errors import PlacementError
from controller.ray_versions import ROCKSDB_STORE, has, installed, refusal
from controller.runtime.edge.answers import TEST_HOOKS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway ``redis-server`` on 127.0.0.1 (no persistence: the cluster's store
    lives as long as this process)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed; scripts/test installs it "
                "(apt-get install -y redis-server)"
            )
        self.port = free_port()
        self._dir = tempfile.mkdtemp(prefix="placectl-redis-")
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", self._dir]
        self._proc = subprocess.Popen(
            [binary, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on 127.0.0.1:{self.port}")
            time.sleep(0.05)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def env(self) -> dict[str, str]:
        """What the head's processes are given to keep their tables here."""
        return {"RAY_REDIS_ADDRESS": self.address}

    def stop(self) -> None:
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


class RocksStore:
    """The GCS's embedded RocksDB store in a directory of its own (removed by ``stop``):
    a new GCS, or a new head node on the same machine, given the same path finds the
    tables the old one kept."""

    name = "rocksdb"

    def __init__(self) -> None:
        release = installed()
        if not has(ROCKSDB_STORE, release):  # its GCS would keep the tables in memory
            raise PlacementError(refusal(ROCKSDB_STORE, release))
        self.path = tempfile.mkdtemp(prefix="placectl-gcs-rocksdb-")

    def env(self) -> dict[str, str]:
        return {"RAY_gcs_storage": "rocksdb", "RAY_gcs_storage_path": self.path}

    def stop(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


RedisServer.name = "redis"
STORES = {"redis": RedisServer, "rocksdb": RocksStore}


class FaultTolerantCluster(Cluster):
    """``ray.cluster_utils.Cluster`` with GCS fault tolerance on ``store``.

    Args:
        store: where the GCS keeps its tables (:class:`RedisServer`, :class:`RocksStore`).
        head_args: arguments of the head node (a fixed ``gcs_server_port`` is added;
            Ray's dashboard is off unless they say, as in ``local_cluster``).
    """

    def __init__(self, store: RedisServer | RocksStore, head_args: dict | None = None) -> None:
        self.store = store
        # Every process this one starts (GCS, raylets, workers) inherits the settings.
        os.environ.update(store.env())
        self.head_args = {
            "include_dashboard": False,
            **(head_args or {}),
            "gcs_server_port": free_port(),
        }
        super().__init__(initialize_head=True, head_node_args=self.head_args)

    def connect(self) -> None:
        """Connect this process as a driver (on the head's raylet)."""
        attach_drivers_to_the_head()
        ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)

    def restart_gcs(self, down_s: float = 0.0) -> float:
        """Kill the head's GCS server and start a new one on the same port and store.

        Returns:
            Seconds from the start of the new GCS until it answers.
        """
        self.head_node.kill_gcs_server()
        time.sleep(down_s)
        started = time.monotonic()
        self.head_node.start_gcs_server()
        self._wait_gcs()
        return time.monotonic() - started

    def stop_head(self) -> None:
        """Kill every process of the head node (this process must not be connected)."""
        if ray.is_initialized():
            raise RuntimeError("disconnect (ray.shutdown()) before the head goes down")
        self.remove_node(self.head_node, allow_graceful=False)

    def start_head(self) -> float:
        """Start a new head node on the same GCS port and store; wait until every worker
        raylet that is still running has registered with it again.

        Returns:
            Seconds from the start of the new head until its GCS answers.
        """
        started = time.monotonic()
        self.add_node(**self.head_args)
        ready = time.monotonic() - started
        self.wait_for_nodes(timeout=120)
        return ready

    def restart_head(self, down_s: float = 0.0) -> float:
        """:meth:`stop_head`, then :meth:`start_head` after ``down_s`` seconds."""
        self.stop_head()
        time.sleep(down_s)
        return self.start_head()

    def _wait_gcs(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.global_state._live_node_ids()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            for k in self.store.env():
                os.environ.pop(k, None)


@contextlib.contextmanager
def restartable_cluster(gpu_nodes: int = 3, gpus: int = 4, store: str = "redis"):
    """A store for the GCS (``redis`` or ``rocksdb``), a head without GPUs on it and
    ``gpu_nodes`` nodes of ``gpus`` fake GPUs and as many CPUs, with this process
    connected; all stopped on exit."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(TEST_HOOKS, "1")  # a controller here answers the tests' hooks
    stores: list[RedisServer | RocksStore] = []

    def head() -> FaultTolerantCluster:
        # A head whose start timed out may have written its GCS's tables: the next
        # start gets a store of its own, as the first did.
        while stores:
            stores.pop().stop()
        stores.append(STORES[store]())
        return FaultTolerantCluster(stores[-1], {"num_cpus": 2, "num_gpus": 0})

    try:
        c = started(head, "head")  # a start that timed out is tried again (local.py)
        try:
            for _ in range(gpu_nodes):  # a start that timed out is tried again (local.py)
                started(lambda: c.add_node(num_cpus=gpus, num_gpus=gpus), "node")
            c.wait_for_nodes()
            c.connect()
            yield c
        finally:
            ray.shutdown()
            c.shutdown()
    finally:
        for kept in stores:
            kept.stop()
