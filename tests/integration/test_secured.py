"""placectl on a cluster with Ray's token authentication on (``RAY_AUTH_MODE=token``),
and with Ray's mutual TLS on top (``RAY_USE_TLS=1``, certificates made by the test).

Each run is a process of its own (``secured_driver.py``): Ray reads its authentication
mode once per process. Verdicts are Ray's: its node table says the lost node is dead,
its actor ids say which ranks were relaunched.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

DRIVER = pathlib.Path(__file__).with_name("secured_driver.py")
# Without authentication repair() returns in 2-7 s after an abrupt node death on 2
# loaded cores (test_abrupt.py bounds it at 10 s); here every new connection is a TLS
# handshake too: 8.7 s and 10.3 s seen beside the rest of the suite, 4 ranks relaunched.
REPAIR_BOUND_S = 15.0


def run(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def secured() -> dict:
    """Token authentication and TLS both on (``RAY_AUTH_MODE=token`` and
    ``RAY_USE_TLS=1``): one run covers both, each run costs a minute of CI."""
    return run("--tls")


def test_the_cli_and_a_client_reserve_attach_and_release_with_the_token(secured):
    assert secured["cli_reserve"][0] == 0, secured["cli_reserve"]
    assert secured["cli_status"][0] == 0 and "sec: ready" in secured["cli_status"][1]
    assert secured["cli_release"][0] == 0, secured["cli_release"]
    assert secured["left"] == []


def test_an_abrupt_node_death_is_repaired_as_fast_as_without_a_token(secured):
    assert secured["denied"] == {}  # every call of placectl's own was let in
    # Dead in Ray's table: Ray's own verdict (0.7 s after the kill on a local cluster) or
    # placectl's fence on proof, whichever came first; placectl fenced no other node.
    assert secured["ray_dead"] and set(secured["fenced"]) <= {secured["lost"]}
    assert secured["repaired"] == secured["doomed"]
    assert secured["repair_s"] < REPAIR_BOUND_S, secured
    assert secured["on_ray_nodes"]  # every rank where the reservation says, as Ray says


def test_a_busy_worker_is_kept(secured):
    survivors = [r for r in range(secured["ranks"]) if r not in secured["doomed"]]
    assert secured["kept_actors"] == survivors  # the busy rank among them, same actor
    assert secured["busy_rank"] in survivors and secured["busy_done"]


def test_calls_refused_for_placectl_fence_nothing_and_leave_the_verdict_to_ray():
    # Token authentication alone here (the run above has TLS too).
    wrong = run("--placectl-token", "wrong")
    assert wrong["fenced"] == []  # placectl fenced nothing: Ray found the node dead
    assert "UNAUTHENTICATED" in wrong["denied"]["gcs"]
    assert wrong["events"].count("denied") == 1  # said once, in the history
    assert wrong["ray_dead"] and wrong["repaired"] == wrong["doomed"]
    survivors = [r for r in range(wrong["ranks"]) if r not in wrong["doomed"]]
    assert wrong["kept_actors"] == survivors  # no rank taken for hung
    assert wrong["on_ray_nodes"]
