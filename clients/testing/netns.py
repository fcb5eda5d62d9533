"""Network namespaces as hosts: made, filled with processes, emptied and swept, and the
netfilter rules that fail their cables (:mod:`clients.testing.hosts` builds a cluster of
them). Needs root, iproute2 (``ip``) and ``iptables``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

PREFIX = "pchost"  # every namespace a harness makes starts so, then the owner's pid


def unavailable() -> str | None:
    """Why this machine cannot run hosts (not root, no ``ip``/``tc``, namespaces
    refused), or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian: apt-get install {package})"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def drop(netns: str, *rule: str, target: tuple[str, ...] = ("DROP",)) -> None:
    """Add a netfilter rule that drops (or ``target``) what ``rule`` matches, in ``netns``."""
    argv = ["ip", "netns", "exec", netns, "iptables", "-w", "-A", *rule, "-j", *target]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[4:])}: {done.stderr.strip()}")


def netns_pids(netns: str) -> list[int]:
    done = ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def kill_netns(netns: str) -> None:
    """Kill every process in ``netns`` until none is left (a dying raylet's workers)."""
    deadline = time.monotonic() + 20
    while (pids := netns_pids(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)
        time.sleep(0.1)


def sweep_stale() -> None:
    """Delete the namespaces of harnesses whose process is gone."""
    names = ip("netns", "list", check=False).stdout.split()
    for name in (n for n in names if n.startswith(PREFIX)):
        digits = "".join(c for c in name[len(PREFIX) :].split("h")[0].split("s")[0])
        if not digits.isdigit() or os.path.exists(f"/proc/{digits}"):
            continue
        kill_netns(name)
        ip("netns", "del", name, check=False)


def raylet_pid(netns: str) -> int | None:
    """The pid of the raylet running in ``netns``, if one runs."""
    for pid in netns_pids(netns):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
            if argv and os.path.basename(argv[0]) == b"raylet":
                return pid
    return None


__all__ = ["PREFIX", "drop", "ip", "kill_netns", "netns_pids", "raylet_pid", "sweep_stale",
           "unavailable"]  # fmt: skip
