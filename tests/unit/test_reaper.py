"""A rank's reaper (clients.reaper), with real processes: a stand-in for the rank's
worker (its title ``ray::...``, as Ray's workers have), a server it started in a session
of its own, and the reaper watching the worker. No Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from clients import reaper


def _start(title: str, tag: str) -> subprocess.Popen:
    """A process carrying ``tag`` whose command line starts with ``title``."""
    env = {**os.environ, reaper.TAG: tag}
    return subprocess.Popen(
        ["bash", "-c", f'exec -a "{title}" sleep 600'], env=env, start_new_session=True
    )


def _until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def _tag() -> str:
    return f"test-reaper-{os.getpid()}-{time.monotonic_ns()}"


def _reaper(pid: int, tag: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != reaper.TAG}
    return subprocess.Popen([sys.executable, "-S", reaper.__file__, str(pid), tag], env=env)


def test_a_rank_gone_takes_its_server_in_a_session_of_its_own_with_it():
    tag = _tag()
    worker, server = _start("ray::Rank", tag), _start("server", tag)
    watcher = _reaper(worker.pid, tag)
    time.sleep(0.5)
    assert reaper.alive(server.pid)  # nothing happens while the rank lives
    worker.kill()
    worker.wait()
    assert watcher.wait(timeout=20) == 0
    server.wait(timeout=5)
    assert server.returncode == -9  # the reaper's SIGKILL, not an exit of its own


def test_the_server_lives_while_another_ray_process_of_the_rank_does():
    """A Ray worker the rank started (a child task's) ends; the rank lives: nothing
    is ended. Then the rank ends too: its server goes."""
    tag = _tag()
    rank, child, server = _start("ray::Rank", tag), _start("ray::child", tag), _start("srv", tag)
    watcher = _reaper(child.pid, tag)
    child.kill()
    child.wait()
    time.sleep(1.5)  # three polls
    assert reaper.alive(server.pid) and watcher.poll() is None
    rank.kill()
    rank.wait()
    assert watcher.wait(timeout=20) == 0
    assert _until(lambda: not reaper.alive(server.pid))


def test_setup_starts_a_reaper_that_carries_no_tag_and_never_fails_the_worker(monkeypatch):
    tag = _tag()
    worker = _start("ray::Rank", tag)
    code = (
        "import os, time; from clients import reaper; reaper.setup(); "
        "print(os.getpid(), flush=True); time.sleep(600)"
    )
    env = {**os.environ, reaper.TAG: tag}
    rank = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    pid = int(rank.stdout.readline())
    server = _start("server", tag)
    assert _until(lambda: any(str(pid) in c for _, c in _reapers()))
    assert all(tag not in _environ(p) for p, _ in _reapers())  # no tag: never swept
    rank.kill()
    rank.wait()
    time.sleep(1.0)
    assert reaper.alive(server.pid)  # the stand-in Ray worker of the rank lives on
    worker.kill()
    worker.wait()
    assert _until(lambda: not reaper.alive(server.pid))
    monkeypatch.delenv(reaper.TAG, raising=False)
    reaper.setup()  # outside a rank: nothing to do, and no error


def _reapers() -> list[tuple[int, str]]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            cmd = reaper._read(f"/proc/{entry}/cmdline").replace(b"\0", b" ").decode()
            if "reaper.py" in cmd:
                out.append((int(entry), cmd))
    return out


def _environ(pid: int) -> str:
    return reaper._read(f"/proc/{pid}/environ").decode(errors="replace")
