"""A Ray cluster of real hosts on one machine, whose network fails as real ones do.

Every host is a Linux network namespace of its own, with its own address and port space,
joined to the others by a bridge that lives in a namespace of its own (the "switch"):
one ``ray start`` per host, head on ``192.0.2.1``, workers on ``.2``, ``.3``, ... Its
faults are the network's, put on the host's cable at the switch or at the host:

* :meth:`Hosts.cut`: a host cut off both ways (its cable unplugged), or one way only;
* :meth:`Hosts.degrade`: a lossy link (each packet lost with a probability, both ways);
* :meth:`Hosts.cut_raylet`: the host's raylet alone cut off, its workers' traffic flowing;
* :meth:`Hosts.split`: a two-sided split (a rack's uplink down): two sets of hosts that
  cannot reach each other, each still reaching its own side, every packet across lost
  (no refusal, no error: connects time out, as across a dead link);
* :meth:`Hosts.reject`: a firewall on one host refusing connections to another (a TCP
  reset): a refusal that is the network's, not the node's;
* :meth:`Hosts.heal`: the cable back as it was (:meth:`Hosts.heal_all`: every host's).

Losses are netfilter rules in the host's namespace, on its cable alone (``iptables``:
``DROP``, ``REJECT``, the ``statistic`` match for random loss), not ``tc netem``, which
the kernels here lack: a slow link (added delay) is not among the faults.

Cutting the head's own cable is the head losing its uplink. What the harness cannot
show: every host shares one kernel, one clock, one process table and one file system,
so a host's processes see the same time, its pids are valid everywhere (which makes
reading a host's process table easy: :meth:`Hosts.pids`), and a cut never stops a disk.

Addresses are TEST-NET-1's (RFC 5737, ``192.0.2.0/24``), routed nowhere: traffic goes
only between the hosts made here. Needs root, iproute2 (``ip``) and ``iptables``, as CI
has;
:func:`unavailable` says why a machine cannot. Everything it starts ends with it: every
process of every host (``ip netns pids``) is killed, then the namespaces are deleted.
Namespaces left by a harness whose process died are swept at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from clients.testing.netns import (
    PREFIX,
    drop,
    ip,
    kill_netns,
    netns_pids,
    raylet_pid,
    sweep_stale,
    unavailable,
)

SUBNET = "192.0.2"  # TEST-NET-1: documentation addresses, routed nowhere
PORT = 6379
RAYLET_PORT = 6380  # every host's raylet listens here (each host has its own port space)


@dataclass(frozen=True)
class Host:
    """One host: its namespace, address, and the two ends of its cable."""

    index: int
    netns: str
    ip: str
    nic: str  # the cable's end inside the host
    port: str  # the cable's end at the switch

    @property
    def is_head(self) -> bool:
        return self.index == 0


class Hosts:
    """A Ray cluster of ``workers`` + 1 hosts in network namespaces.

    Args:
        workers: hosts beside the head.
        gpus, cpus: what each worker host declares (fake GPUs).
        head_cpus: the head's CPUs (it declares no GPUs: the controller runs there).
        system_config: Ray's ``--system-config`` for the head (its health checks).
        env: variables every process of every host sees, beside the test hooks'.
    """

    def __init__(
        self,
        workers: int = 3,
        gpus: int = 2,
        cpus: int = 2,
        head_cpus: int = 2,
        system_config: dict | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if not 1 <= workers <= 250:
            raise ValueError(f"workers={workers}: expected 1 to 250 hosts beside the head")
        self.owner = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.owner}sw"
        self.hosts = [
            Host(i, f"{self.owner}h{i}", f"{SUBNET}.{i + 1}", f"ph{os.getpid()}x{i}"[-15:],
                 f"ps{os.getpid()}x{i}"[-15:])
            for i in range(workers + 1)
        ]  # fmt: skip
        self.gpus, self.cpus, self.head_cpus = gpus, cpus, head_cpus
        self.system_config = system_config or {}
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PLACECTL_TEST_HOOKS": "1",
            # Ray's `ray start --head` turns token auth on by itself when the mode is unset
            # and a token is on the machine (~/.ray/auth_token, RAY_AUTH_TOKEN); a worker
            # host's `ray start` does not, and is refused. The caller decides, not the
            # machine's leftovers: off unless its environment or `env` says otherwise.
            "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
            **(env or {}),
        }
        self.tmp = ""
        self._made: list[str] = []

    @property
    def address(self) -> str:
        """The head's GCS address, as a driver on any host passes it to ``ray.init``."""
        return f"{self.hosts[0].ip}:{PORT}"

    @property
    def head(self) -> Host:
        return self.hosts[0]

    # ------------------------------------------------------------ life
    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, timeout: float = 180.0) -> Hosts:
        """Make the network, then start Ray on every host; returns once every host's
        node is alive in Ray."""
        why = unavailable()
        if why is not None:
            raise RuntimeError(f"cannot run hosts in network namespaces here: {why}")
        sweep_stale()
        try:
            self._network()
            self.tmp = tempfile.mkdtemp(prefix="placectl-hosts-")
            self._ray_start(self.head, ["--head", f"--port={PORT}"])
            starts = [
                (h, self._ray_start(h, [f"--address={self.address}"], wait=False))
                for h in self.hosts[1:]
            ]
            for h, p in starts:
                if p.wait(timeout=timeout) != 0:
                    raise RuntimeError(f"ray start on {h.ip} failed: {self._log(h)[-2000:]}")
            self._wait_nodes(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every process of every host, then delete the namespaces."""
        for ns in [h.netns for h in self.hosts] + [self.switch]:
            if ns in self._made:
                kill_netns(ns)
        for ns in reversed(self._made):
            ip("netns", "del", ns, check=False)
        self._made.clear()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = ""

    def _network(self) -> None:
        ip("netns", "add", self.switch)
        self._made.append(self.switch)
        ip("-n", self.switch, "link", "set", "lo", "up")
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            ip("netns", "add", h.netns)
            self._made.append(h.netns)
            ip("-n", h.netns, "link", "set", "lo", "up")
            ip("link", "add", h.nic, "netns", h.netns, "type", "veth", "peer", "name", h.port,
                "netns", self.switch)  # fmt: skip
            ip("-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", h.nic)
            ip("-n", h.netns, "link", "set", h.nic, "up")
            ip("-n", self.switch, "link", "set", h.port, "master", "br0")
            ip("-n", self.switch, "link", "set", h.port, "up")

    def _ray_start(self, h: Host, args: list[str], wait: bool = True) -> subprocess.Popen:
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        argv = [
            ray, "start", *args, f"--node-ip-address={h.ip}",
            f"--temp-dir={os.path.join(self.tmp, f'h{h.index}')}",
            f"--num-cpus={self.head_cpus if h.is_head else self.cpus}",
            f"--num-gpus={0 if h.is_head else self.gpus}",
            f"--node-manager-port={RAYLET_PORT}",
            "--disable-usage-stats",
        ]  # fmt: skip
        if h.is_head:
            argv.append("--include-dashboard=false")
            if self.system_config:
                argv.append(f"--system-config={json.dumps(self.system_config)}")
        log = open(self._log_path(h), "a")  # noqa: SIM115 (the child holds it)
        p = self.run(h, argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if wait:
            p.wait(timeout=180)
            if p.returncode != 0:
                raise RuntimeError(f"ray start on {h.ip} failed: {self._log(h)[-2000:]}")
        return p

    def _log_path(self, h: Host) -> str:
        return os.path.join(self.tmp, f"ray-start-h{h.index}.log")

    def _log(self, h: Host) -> str:
        with contextlib.suppress(OSError), open(self._log_path(h)) as f:
            return f.read()
        return ""

    def _wait_nodes(self, timeout: float, new: dict[str, Sequence[str]] | None = None) -> None:
        """Until as many nodes as hosts are alive in Ray (a host's dead nodes aside) and,
        for each address of ``new``, a node there not among its old ids: a host's old
        node that Ray still calls alive (drained, not yet found dead) is not its new one."""
        want = len(self.hosts)
        new = {ip: sorted(old) for ip, old in (new or {}).items()}
        code = (
            "import ray, time, sys\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
            f"end, new = time.monotonic() + {timeout}, {new!r}\n"
            "while time.monotonic() < end:\n"
            "    alive = [x for x in ray.nodes() if x['Alive']]\n"
            "    born = {x['NodeManagerAddress'] for x in alive\n"
            "            if x['NodeID'] not in new.get(x['NodeManagerAddress'], ())}\n"
            f"    if len(alive) >= {want} and set(new) <= born: sys.exit(0)\n"
            "    time.sleep(0.2)\n"
            "sys.exit(1)\n"
        )
        if self.run(self.head, [sys.executable, "-c", code]).wait(timeout=timeout + 60) != 0:
            raise RuntimeError(f"not all {want} hosts joined the cluster within {timeout:g}s")

    def crash(self, host: Host | int) -> None:
        """``host`` loses its power: every process on it killed at once (SIGKILL), no
        word to Ray; its cable stays as it is. :meth:`restart` boots it again."""
        h = self.hosts[host] if isinstance(host, int) else host
        if h.is_head:
            raise ValueError("crash() takes a worker host; the head is the cluster")
        kill_netns(h.netns)

    def restart(self, *hosts: Host | int, timeout: float = 120.0) -> None:
        """Each of ``hosts`` rebooted: every process on it killed, its cable healed, and
        Ray started on it again as a new node (worker hosts only). All of them boot
        before the wait for the cluster to be whole again, which needs every one."""
        picked = [self.hosts[h] if isinstance(h, int) else h for h in hosts]
        if any(h.is_head for h in picked):
            raise ValueError("restart() takes worker hosts; the head is the cluster")
        old = {h.ip: self.node_ids(h) for h in picked}
        for h in picked:
            kill_netns(h.netns)
            self.heal(h)
            self._ray_start(h, [f"--address={self.address}"])
        self._wait_nodes(timeout, new=old)

    def node_ids(self, host: Host | int) -> list[str]:
        """The ids of the nodes Ray knows on ``host``, alive or dead (asked from the head)."""
        h = self.hosts[host] if isinstance(host, int) else host
        code = (
            "import ray\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
            f"print(' '.join(x['NodeID'] for x in ray.nodes()\n"
            f"               if x['NodeManagerAddress'] == {h.ip!r}))\n"
        )
        argv = [sys.executable, "-c", code]
        done = self.run(self.head, argv, stdout=subprocess.PIPE, text=True)
        out, _ = done.communicate(timeout=120)
        return out.split()

    # ------------------------------------------------------------ processes
    def run(self, host: Host | int, argv: Sequence[str], **popen) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (inside its namespace), with the hosts' variables."""
        h = self.hosts[host] if isinstance(host, int) else host
        env = {**self.env, **popen.pop("env", {})}
        return subprocess.Popen(["ip", "netns", "exec", h.netns, *argv], env=env, **popen)

    def raylet_pid(self, host: Host | int) -> int | None:
        """The pid of ``host``'s raylet, if one runs there."""
        h = self.hosts[host] if isinstance(host, int) else host
        return raylet_pid(h.netns)

    def kill_raylet(self, host: Host | int) -> None:
        """``host``'s raylet killed (SIGKILL), the host up: its port refused from then on."""
        pid = self.raylet_pid(host)
        if pid is None:
            raise RuntimeError("no raylet runs on that host")
        os.kill(pid, 9)

    def pids(self, host: Host | int) -> list[int]:
        """Every process running on ``host`` now (its namespace's process table)."""
        h = self.hosts[host] if isinstance(host, int) else host
        return netns_pids(h.netns)

    # ------------------------------------------------------------ faults
    def cut(self, host: Host | int, way: str = "both") -> None:
        """Cut ``host`` off: ``both`` ways (its cable unplugged at the switch), or only
        what comes ``in`` to it, or only what goes ``out`` of it (every packet lost)."""
        h = self.hosts[host] if isinstance(host, int) else host
        if way == "both":
            ip("-n", self.switch, "link", "set", h.port, "down")
        elif way == "in":
            drop(h.netns, "INPUT", "-i", h.nic)
        elif way == "out":
            drop(h.netns, "OUTPUT", "-o", h.nic)
        else:
            raise ValueError(f"way={way!r}: expected 'both', 'in' or 'out'")

    def cut_raylet(self, host: Host | int) -> None:
        """Cut ``host``'s raylet alone off: every packet that comes to its port is lost,
        while its workers' traffic, and what the raylet itself sends, still flow."""
        h = self.hosts[host] if isinstance(host, int) else host
        drop(h.netns, "INPUT", "-i", h.nic, "-p", "tcp", "--dport", str(RAYLET_PORT))

    def degrade(self, host: Host | int, loss: float) -> None:
        """Make ``host``'s link lossy: each packet, in either direction, lost with
        probability ``loss`` (0-1)."""
        h = self.hosts[host] if isinstance(host, int) else host
        if not 0 < loss <= 1:
            raise ValueError(f"loss={loss}: expected a share of packets, above 0 and at most 1")
        chance = ["-m", "statistic", "--mode", "random", "--probability", f"{loss:g}"]
        drop(h.netns, "INPUT", "-i", h.nic, *chance)
        drop(h.netns, "OUTPUT", "-o", h.nic, *chance)

    def split(self, side: Sequence[Host | int], other: Sequence[Host | int] = ()) -> None:
        """Split the network in two: the hosts of ``side`` and those of ``other``
        (default: every other host) lose every packet between them, both ways, while each
        side reaches itself (a rack's uplink down). :meth:`heal_all` ends it."""
        a = [self.hosts[h] if isinstance(h, int) else h for h in side]
        b = [self.hosts[h] if isinstance(h, int) else h for h in other]
        b = b or [h for h in self.hosts if h not in a]
        if set(a) & set(b):
            raise ValueError("split(): a host cannot stand on both sides")
        for here, there in [*((x, y) for x in a for y in b), *((y, x) for x in a for y in b)]:
            drop(here.netns, "INPUT", "-i", here.nic, "-s", there.ip)
            drop(here.netns, "OUTPUT", "-o", here.nic, "-d", there.ip)

    def reject(self, host: Host | int, toward: Host | int) -> None:
        """A firewall on ``host`` refusing its connections to ``toward`` with a TCP reset
        (``REJECT``): ``toward`` runs, but ``host`` hears a refusal from it."""
        h = self.hosts[host] if isinstance(host, int) else host
        t = self.hosts[toward] if isinstance(toward, int) else toward
        reset = ("REJECT", "--reject-with", "tcp-reset")
        drop(h.netns, "OUTPUT", "-o", h.nic, "-d", t.ip, "-p", "tcp", target=reset)

    def heal(self, host: Host | int) -> None:
        """``host``'s cable as it was: plugged in, nothing dropped or rejected there."""
        h = self.hosts[host] if isinstance(host, int) else host
        subprocess.run(["ip", "netns", "exec", h.netns, "iptables", "-w", "-F"], check=True)
        ip("-n", self.switch, "link", "set", h.port, "up")

    def heal_all(self) -> None:
        """Every host's cable as it was (a split, rejections and cuts ended)."""
        for h in self.hosts:
            self.heal(h)


__all__ = ["SUBNET", "Host", "Hosts", "unavailable"]
