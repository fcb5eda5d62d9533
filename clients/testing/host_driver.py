"""A driver to run on a host of :class:`clients.testing.hosts.Hosts`, steered over its
standard input, one command a line, answering one JSON object a line on its output:
what a user's training loop does, and what the tests and the benchmark need to see.

``python -m clients.testing.host_driver --address 192.0.2.1:6379 --mode placectl
--config conf.yaml`` reserves the job ``net``, launches one :class:`Rank` per process of
its component ``actor`` and answers ``{"event": "ready", "ranks": [...]}``. With
``--mode plain`` it uses no placectl: one :class:`Rank` actor per worker host, pinned
there, as a job on Ray alone would hold them. Then, per command:

* ``where``: each rank's pid, host and ``RANK``, or ``null`` where it does not answer
  within a second (``{"event": "where", "ranks": [...]}``);
* ``spawn`` (placectl): each rank starts a process in a session of its own (``pids``);
* ``repair`` (placectl): ``WorkerGroup.repair()`` at once, timed (``lost``, ``seconds``);
* ``drain NODE`` (placectl): what a spot notice does: Ray's PREEMPTION drain of node
  ``NODE`` with a minute's deadline; then the reservation's next epoch awaited, the ranks
  Ray calls dead read (``dead``: none, if the move is made before the break), and the
  group brought to the epoch (``moved``, ``kept``, ``seconds``);
* ``health`` (placectl): the controller's ``health()``;
* ``events`` (placectl): the kinds and messages of the controller's event history;
* ``nodes``: every node Ray knows, with its address, whether Ray calls it alive, and
  why it died (Ray's reason: its health checks, or ``placectl fenced the node: ...``);
* ``free``: the GPUs Ray reports free on each alive node, by address;
* ``quit``.

``--mode restart`` kills the controller's process (Ray restarts it) and answers
``{"event": "restarted", "seconds": ...}`` once the new one has recovered
(:func:`restart_controller` runs it on the head).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

import ray

JOB = "net"


class Rank:
    """One process of the job: says where it runs; starts a server of its own."""

    def spawn(self) -> int:
        """Start a stand-in for an engine's server in a session of its own (it would
        outlive the rank but for placectl); its pid."""
        import subprocess

        return subprocess.Popen(["sleep", "600"], start_new_session=True).pid

    def where(self) -> dict:
        return {
            "pid": os.getpid(),
            "ip": ray.util.get_node_ip_address(),
            "node": ray.get_runtime_context().get_node_id(),
            "rank": os.environ.get("RANK"),
        }


def _out(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _where(actors: list) -> list:
    refs = [a.where.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
    done = set(ready)
    out = []
    for ref in refs:
        try:
            out.append(ray.get(ref) if ref in done else None)
        except Exception:
            out.append(None)
    return out


def _nodes() -> list:
    return [
        {
            "ip": n["NodeManagerAddress"],
            "node": n["NodeID"],
            "alive": bool(n["Alive"]),
            "why": n.get("DeathReasonMessage") or "",
        }
        for n in ray.nodes()
    ]


def _free() -> dict:
    free = ray._private.state.available_resources_per_node()
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    return {"gpus": {ips[n]: r.get("GPU", 0.0) for n, r in free.items() if n in ips}}


def _serve(commands: dict) -> None:
    """Answer each command read from standard input (a name, then its arguments) with
    ``{"event": name, ...}``, what ``commands[name](*arguments)`` returns, until ``quit``."""
    for line in sys.stdin:
        cmd, *args = line.split() or [""]
        if cmd == "quit":
            break
        if cmd in commands:
            _out(cmd, **commands[cmd](*args))
        else:
            _out("error", message=f"unknown command {cmd!r}")


def _placectl(args) -> None:
    import clients

    settings = json.loads(args.settings or "{}")
    ctl = clients.connect(address=args.address, settings=settings)
    res = ctl.reserve(JOB, args.config, timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", ray.remote(Rank))
    _out("ready", ranks=group.execute("where"))

    def repair() -> dict:
        started = time.monotonic()

        def said(m: str) -> None:
            _out("progress", message=m, at=round(time.monotonic() - started, 2))

        lost = group.repair(timeout=120, progress=said)
        return {"lost": lost, "seconds": round(time.monotonic() - started, 2)}

    def drain(node: str) -> dict:
        from clients.testing import machines

        started, epoch = time.monotonic(), res.epoch
        machines.drain(node, deadline=time.time() + 60)
        res.wait_ready(timeout=120, newer_than=epoch)
        dead = group.dead_ranks()
        moved = group.sync(timeout=120)
        seconds = round(time.monotonic() - started, 2)
        return {"dead": dead, "moved": moved.moved, "kept": moved.kept, "seconds": seconds}

    _serve(
        {
            "where": lambda: {"ranks": _where(group.actors)},
            "drain": drain,
            "spawn": lambda: {"pids": group.execute("spawn")},
            "repair": repair,
            "health": ctl.health,
            "events": lambda: {"events": [[e.kind, e.message] for e in ctl.events()]},
            "timeline": lambda: {"events": [[e.at, e.kind, e.message] for e in ctl.events()]},
            "nodes": lambda: {"nodes": _nodes()},
            "free": _free,
        }
    )
    group.shutdown()
    ctl.release(JOB)


def _plain(args) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=args.address, logging_level="ERROR")
    own = ray.get_runtime_context().get_node_id()
    hosts = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != own]
    cls = ray.remote(Rank)
    actors = [
        cls.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], False)
        ).remote()
        for n in sorted(hosts, key=lambda n: n["NodeManagerAddress"])
    ]
    _out("ready", ranks=ray.get([a.where.remote() for a in actors]))
    _serve(
        {
            "where": lambda: {"ranks": _where(actors)},
            "nodes": lambda: {"nodes": _nodes()},
            "free": _free,
        }
    )


class Driver:
    """This driver running on one host of ``hosts``, seen from the test's side.

    Args:
        hosts: a started :class:`clients.testing.hosts.Hosts`.
        host: where it runs (default the head, as a job's driver usually does).
        mode, config, settings: as the command line's.
        ready_timeout: how long it may take to reserve and launch.
    """

    def __init__(self, hosts, host=0, mode="placectl", config=None, settings=None,
                 ready_timeout: float = 180.0) -> None:  # fmt: skip
        argv = [sys.executable, "-u", "-m", "clients.testing.host_driver", "--mode", mode,
                "--address", hosts.address]  # fmt: skip
        if config:
            argv += ["--config", str(config)]
        if settings:
            argv += ["--settings", json.dumps(settings)]
        self.log: list[dict] = []
        self._unclaimed: list[dict] = []
        self._lines: queue.Queue = queue.Queue()
        self.proc = hosts.run(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.wait("ready", ready_timeout)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._lines.put(json.loads(line))
        self._lines.put({"event": "exited", "code": self.proc.wait()})

    def wait(self, event: str, timeout: float) -> dict:
        """The next answer ``event``; the ones before it are kept in ``log``, and those
        not awaited yet (an answer to a command sent earlier) until they are."""
        for i, got in enumerate(self._unclaimed):
            if got["event"] == event:
                return self._unclaimed.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise TimeoutError(f"no {event!r} from the driver within {timeout:g}s") from None
            self.log.append(got)
            if got["event"] == event:
                return got
            if got["event"] in ("exited", "error"):
                raise RuntimeError(f"the driver said {got} while {event!r} was awaited")
            if got["event"] != "progress":
                self._unclaimed.append(got)

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def ask(self, command: str, event: str | None = None, timeout: float = 60.0) -> dict:
        """Send ``command``; its answer (``event``, by default the command's name)."""
        self.send(command)
        return self.wait(event or command, timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()


def _restart(args) -> None:
    """Kill the controller's process as a crash does (Ray restarts it) and wait until
    the new one has recovered; ``{"event": "restarted", "seconds": ...}``."""
    import clients

    ctl = clients.connect(address=args.address)
    before, started = ctl.check_alive(), time.monotonic()
    ray.kill(ctl.handle, no_restart=False)
    while time.monotonic() - started < 120:
        try:
            health = ctl.health()
            if health["incarnation"] != before and health["recovered"]:
                break
        except Exception:  # the old process gone, the new one not answering yet
            pass
        time.sleep(0.2)
    else:
        _out("error", message="the controller did not come back within 120 s")
        return
    _out("restarted", seconds=round(time.monotonic() - started, 2))


def restart_controller(hosts, timeout: float = 150.0) -> float:
    """From the test's side: kill the controller from a process on the head (a driver
    busy in a call cannot) and wait for the new one; the seconds it took."""
    argv = [sys.executable, "-u", "-m", "clients.testing.host_driver", "--mode", "restart",
            "--address", hosts.address]  # fmt: skip
    proc = hosts.run(0, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out, _ = proc.communicate(timeout=timeout)
    got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not got or got[-1]["event"] != "restarted":
        raise RuntimeError(f"restarting the controller failed: {got or out[-2000:]}")
    return got[-1]["seconds"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True)
    p.add_argument("--mode", choices=["placectl", "plain", "restart"], default="placectl")
    p.add_argument("--config", help="the job's configuration (placectl mode)")
    p.add_argument("--settings", help="the controller's settings, as JSON")
    args = p.parse_args(argv)
    {"placectl": _placectl, "plain": _plain, "restart": _restart}[args.mode](args)


if __name__ == "__main__":
    main()
