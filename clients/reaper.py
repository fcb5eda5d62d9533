"""On the worker's own host, ending what a rank left behind once every Ray process of
it is gone, even where nothing of Ray runs any more.

placectl's sweep (:mod:`clients.leftovers`) ends a stopped rank's leftovers with a task
on its node. A node that was fenced while cut off has no Ray left when it comes back:
its raylet learns it was declared dead and exits, Ray's workers exit with it, and a
process a rank started in a session of its own (an engine's server) would run on, with
its devices and ports, where no task can reach it.

So every process placectl starts for a rank runs :func:`setup` when it starts (Ray's
``worker_process_setup_hook``), which starts a reaper beside it: a small process of its
own session, importing nothing but the standard library, that waits for the worker's
pid to go. Then, if no Ray process carrying the rank's tag is left on the host (the rank
and the Ray workers it started), it ends every process still carrying the tag; if one
is left, it waits for that one in turn. A reaper carries no tag, and ends by itself.

Run as a script (``python reaper.py PID TAG``) so that it imports no package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

TAG = "PLACECTL_WORKER"  # the variable every process of a rank inherits (leftovers.TAG)
USER_HOOK = "PLACECTL_USER_SETUP_HOOK"  # a setup hook of the job's own, run after ours
POLL_S = 0.5
REAP_S = 10.0  # how long a reaper keeps ending what the rank's processes still start


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, a zombie, or not ours to read
        return b""


def tagged(tags, proc: str = "/proc") -> dict[int, tuple[str, str]]:
    """pid -> (tag, command line) of every live process whose environment holds one of
    ``tags`` (this process excepted)."""
    wanted = {f"{TAG}={t}".encode() for t in tags}
    found: dict[int, tuple[str, str]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        hit = wanted.intersection(_read(f"{proc}/{entry}/environ").split(b"\0"))
        if hit:
            cmd = _read(f"{proc}/{entry}/cmdline").replace(b"\0", b" ").strip()
            tag = hit.pop().decode().partition("=")[2]
            found[int(entry)] = (tag, cmd.decode(errors="replace")[:200])
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie, read from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def is_ray_worker(command: str) -> bool:
    """A Ray worker process (its title is ``ray::...``): Ray ends those itself."""
    return command.startswith("ray::")


def reap(pid: int, tag: str, poll: float = POLL_S) -> list[int]:
    """Wait until ``pid`` and every Ray process carrying ``tag`` here are gone, then
    end every process still carrying it. The pids ended."""
    watched = pid
    while True:
        while alive(watched):
            time.sleep(poll)
        rays = [p for p, (_, cmd) in tagged([tag]).items() if is_ray_worker(cmd)]
        if not rays:
            break
        watched = min(rays)  # the rank lives on in another of its Ray processes
    ended: set[int] = set()
    deadline = time.monotonic() + REAP_S
    while (left := tagged([tag])) and time.monotonic() < deadline:
        if any(is_ray_worker(cmd) for _, cmd in left.values()):
            break  # a new rank of the same name started here: what it starts is its own
        for p in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
                ended.add(p)
        time.sleep(0.05)
    return sorted(ended)


def setup() -> None:
    """Ray's ``worker_process_setup_hook`` for a rank's processes: start this process's
    reaper (never failing the worker's start), then the job's own hook, if any."""
    tag = os.environ.get(TAG)
    if tag:
        env = {k: v for k, v in os.environ.items() if k not in (TAG, USER_HOOK)}
        with contextlib.suppress(Exception):
            subprocess.Popen(
                [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), tag],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
    user = os.environ.get(USER_HOOK)
    if user:  # the job's own hook, which placectl's took the place of
        module, _, name = user.rpartition(".")
        getattr(__import__(module, fromlist=[name]), name)()


if __name__ == "__main__":
    reap(int(sys.argv[1]), sys.argv[2])
