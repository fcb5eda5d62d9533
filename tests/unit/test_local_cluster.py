"""The test clusters' start: a node start that timed out is cleaned up and tried again
(Ray's raylet once never registered on CI's 2 loaded cores; a head's GCS server once
never wrote its port file)."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from clients.testing import local


@pytest.mark.parametrize(
    "said",
    [
        "The current node timed out during startup. ...",
        "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ce58ac7a",
    ],
)
def test_a_start_that_timed_out_is_killed_and_tried_again(said):
    left: list[subprocess.Popen] = []

    def start() -> str:
        # As Ray's node start does: processes started, then a wait that gives up.
        left.append(subprocess.Popen(["sleep", "600"]))
        if len(left) == 1:
            raise RuntimeError(said)
        return "node"

    assert local.started(start, "node") == "node"
    assert not psutil.pid_exists(left[0].pid)  # the first start's process: killed, reaped
    assert left[1].poll() is None  # the second start's, kept
    left[1].kill()
    left[1].wait()


def test_other_errors_and_the_last_timeout_are_raised_and_keep_older_processes():
    older = subprocess.Popen(["sleep", "600"])
    try:
        with pytest.raises(ValueError, match="bad"):
            local.started(lambda: (_ for _ in ()).throw(ValueError("bad")), "head")
        with pytest.raises(Exception, match="timed out during startup"):
            local.started(
                lambda: (_ for _ in ()).throw(Exception("timed out during startup")), "head"
            )
        assert psutil.Process(older.pid).status() != psutil.STATUS_ZOMBIE
    finally:
        older.kill()
        older.wait()
