"""Network faults on real hosts: a Ray cluster of five hosts, each in a network namespace
of its own with its own address (clients.testing.hosts), head on 192.0.2.1 and four
worker hosts of 2 fake GPUs. The job (data/network.yaml) holds 4 GPUs on two worker
hosts; the other two are free. Its driver runs on the head, as a job's driver does, and
calls ``repair()`` the instant a fault is put on the network.

Blips cost nothing, deaths cost seconds: every shape of fault below lasts 5 s and 30 s,
both shorter than the grace (Ray's own detection of a silent node, 62 s with its
defaults), and costs no node: every host's node is alive in Ray afterwards with the same
raylet, no fence was sent, and the group answers with one live process per rank. Where
the controller has evidence (a job's host cut off, the job's hosts split from the head's
side), the suspects' ranks move at once and nothing of them survives on the host once it
answers again; where it has none (the head's side is the minority, a lossy link), nothing
moves. A host whose death is proven (its raylet gone, the host up) is fenced at once, and
one cut off for good only after the grace.

What each test reads is the outside's: the ranks' own pids and hosts (asked of the
workers), Ray's node table, the hosts' process tables (``ip netns pids``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clients.testing import hosts as harness
from clients.testing.host_driver import Driver

# Blips are timed against a grace of 5 s, a cut host against Ray's own 62 s, on a machine
# doing nothing else. Beside another lane's busy cluster (load 15 on 2 cores), a host cut
# for good was once out after 7 s on a refusal instead of after the grace: not explained
# yet, not seen alone (1 of 1 runs passed there).
pytestmark = pytest.mark.alone

CONFIG = Path(__file__).parent / "data" / "network.yaml"
# The stated figures (scripts/bench/bench_network.py, docs/evidence/benchmarks.md): a
# host cut off to repair() returned in 3.8 s (3.8-4.7 s), a refused raylet's ranks
# relaunched in 3.5 s, on 2 idle cores; CI's bounds leave room for its load.
CUT_REPAIR_BOUND_S = 8.0
REFUSED_REPAIR_BOUND_S = 10.0
GONE_AFTER_HEAL_S = 60.0  # the moved ranks' processes, ended by the controller's sweep
# A suspect answers the controller again once its connections are made anew after the
# heal (every late one is dropped): seconds, or after a long cut the GCS's backoff.
BACK_AFTER_HEAL_S = 90.0


@pytest.fixture(scope="module")
def hosts():
    why = harness.unavailable()
    if why is not None:
        if os.environ.get("PLACECTL_NO_SKIPS") == "1":
            pytest.fail(f"the network tests need hosts in network namespaces: {why}")
        pytest.skip(f"the network tests need hosts in network namespaces: {why}")
    # A token on the machine (a token-authenticated run leaves ~/.ray/auth_token), the
    # mode unset: the harness's cluster stays as its caller asked, every host joining.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_TOKEN", "left-on-this-machine-by-an-earlier-run")
        mp.delenv("RAY_AUTH_MODE", raising=False)
        hosts = harness.Hosts(workers=4, gpus=2, cpus=2)
    with hosts as h:
        yield h


@pytest.fixture(scope="module")
def driver(hosts):
    # A dozen unrelated faults back to back on the same four hosts within ten minutes:
    # to the controller, hosts that flap. Held down, one would leave the next case
    # without the free hosts it moves to; the hold-down has its own tests (test_blips).
    d = Driver(hosts, config=CONFIG, settings={"hold_down_after": "0"})
    yield d
    d.close()


def _pids(ranks) -> list:
    return [r and r["pid"] for r in ranks]


def _answering(driver, timeout=60.0) -> list:
    """Every rank's answer, once all of them answer."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = driver.ask("where")["ranks"]
        if all(ranks) or time.monotonic() > deadline:
            return ranks
        time.sleep(0.5)


def _nodes(driver) -> dict[str, str]:
    """Each alive node of Ray's table: id -> address."""
    return {n["node"]: n["ip"] for n in driver.ask("nodes")["nodes"] if n["alive"]}


def _job_hosts(hosts, ranks) -> list[int]:
    ips = {r["ip"] for r in ranks}
    return [h.index for h in hosts.hosts if h.ip in ips]


def _idle_hosts(hosts, ranks) -> list[int]:
    job = set(_job_hosts(hosts, ranks))
    return [h.index for h in hosts.hosts[1:] if h.index not in job]


# After a cut of 30 s Ray's GCS may declare a healed host dead up to about 26 s after
# the heal (measured with Ray alone: its health-check connection stuck in TCP's backoff).
# The next test waits that out, so that Ray's late verdict on one test's host does not
# land in the middle of the next.
RAY_LATE_VERDICT_S = 35.0
_long_cut_healed = [0.0]  # when the last cut of 30 s was healed (monotonic)


def _settled(hosts, driver, timeout: float = 90.0) -> list:
    """The ranks, once every host is back to its resting state: Ray's late verdict on
    a long cut waited out, a host whose node Ray declared dead rebooted, and each worker
    host not the job's with its 2 GPUs free in Ray's view (after a long cut Ray's GCS
    reaches a healed host's raylet only after its connection's backoff, 28 s after a 30 s
    cut, measured, and the groups removed then hold its GPUs until it does)."""
    time.sleep(max(0.0, _long_cut_healed[0] + RAY_LATE_VERDICT_S - time.monotonic()))
    alive = {n["ip"] for n in driver.ask("nodes")["nodes"] if n["alive"]}
    lost = [h for h in hosts.hosts[1:] if h.ip not in alive]
    if lost:  # all at once: the cluster is whole again only with every one back
        hosts.restart(*lost)
    deadline = time.monotonic() + timeout
    while True:
        ranks = _answering(driver)
        busy = {r["ip"] for r in ranks}
        free = driver.ask("free")["gpus"]
        idle = [h.ip for h in hosts.hosts[1:] if h.ip not in busy]
        if all(free.get(ip) == 2.0 for ip in idle) or time.monotonic() > deadline:
            return ranks
        time.sleep(1.0)


def _one_process_per_rank(hosts, before: list, after: list) -> None:
    """Every rank answers from one process, and no process of a rank that moved lives
    on any host (read from the hosts' process tables), within GONE_AFTER_HEAL_S."""
    assert len({r["rank"] for r in after}) == len(after) == len(before)
    assert len(set(_pids(after))) == len(after)
    old = set(_pids(before)) - set(_pids(after))
    deadline = time.monotonic() + GONE_AFTER_HEAL_S
    while time.monotonic() < deadline:
        running = {p for h in hosts.hosts for p in hosts.pids(h)}
        if not old & running:
            break
        time.sleep(0.5)
    assert not old & running, f"processes of ranks that moved still run: {old & running}"


# Each shape: what it does to the network, given the job's hosts and the idle ones, and
# which ranks repair() relaunches (their hosts were suspected: the slots moved).
SHAPES = {
    "a job host cut off": (lambda h, job, idle: h.cut(job[0]), "first host's"),
    "the job's hosts split from the head's side": (
        lambda h, job, idle: h.split(job, [0, *idle]),
        "all",
    ),
    "the head's side split from the job's": (
        lambda h, job, idle: h.split([0, idle[0]], [*job, idle[1]]),
        "none",
    ),
    "the head's own link down": (lambda h, job, idle: h.cut(0), "none"),
    "a lossy link (30%)": (lambda h, job, idle: h.degrade(job[0], loss=0.3), "none"),
}


# Every shape blips for 5 s, and for 30 s but the head's side split from the job's: its
# long case is the head's own link down (the head reaching no host rather than one idle
# host; either way the controller reaches no majority and suspects itself), which saves
# CI a long cut and the wait for Ray's late verdict after it (about 70 s).
LOSSY = "a lossy link (30%)"  # loses packets, never the path: no late verdict follows it
LONG_SHAPES = [
    LOSSY,
    *(s for s in SHAPES if s not in (LOSSY, "the head's side split from the job's")),
]
# Every shape's short blip first, then the long ones, the lossy link first of them: only
# a long cut's heal is followed by Ray's late verdict, which the next test waits out
# (RAY_LATE_VERDICT_S), so the short blips and the lossy link wait for none (about 25 s
# each, when they came after a long cut).
BLIPS = [(5.0, s) for s in SHAPES] + [(30.0, s) for s in LONG_SHAPES]


@pytest.mark.parametrize(
    ("seconds", "shape"), BLIPS, ids=[f"{seconds}-{shape}" for seconds, shape in BLIPS]
)
def test_a_blip_shorter_than_the_grace_costs_no_node(hosts, driver, shape, seconds):
    before = _settled(hosts, driver)
    nodes = _nodes(driver)
    raylets = {h.index: hosts.raylet_pid(h) for h in hosts.hosts}
    fenced = dict(driver.ask("health")["fenced"])
    job, idle = _job_hosts(hosts, before), _idle_hosts(hosts, before)
    fault, moving = SHAPES[shape]
    fault(hosts, job, idle)
    driver.send("repair")  # the instant the fault is on, as a user's loop reacts
    time.sleep(seconds)
    hosts.heal_all()
    if seconds > 5.0 and shape != LOSSY:
        _long_cut_healed[0] = time.monotonic()
    repaired = driver.wait("repair", 240)
    # No node lost by placectl. Ray's own health checks may give a healed node up after
    # a long cut (Ray alone, measured: a host cut for 30 s declared dead 26 s after the
    # heal, its health-check connection stuck past it): theirs, never placectl's, and
    # the ranks there are lost whatever placectl believes.
    lost = {n["ip"]: n["why"] for n in driver.ask("nodes")["nodes"] if n["node"] in nodes
            and not n["alive"]}  # fmt: skip
    assert all("health check" in why for why in lost.values()), lost
    on = {h: [i for i, r in enumerate(before) if r["ip"] == hosts.hosts[h].ip] for h in job}
    expected = {"none": [], "all": sorted(on[job[0]] + on[job[1]]), "first host's": on[job[0]]}
    by_ray = [i for i, r in enumerate(before) if r["ip"] in lost]
    # At least the suspects' ranks (a blip of 5 s may end before their slots have moved:
    # suspected after 2-3 s, then a repair; nothing moved costs nothing either), at most
    # those and the ranks on a node Ray gave up (before repair() returned, or after).
    least = set(expected[moving]) if seconds > 5.0 else set()
    assert least <= set(repaired["lost"]) <= {*expected[moving], *by_ray}, (
        shape, seconds, repaired, lost,
    )  # fmt: skip
    after = _answering(driver)
    _one_process_per_rank(hosts, before, after)
    assert driver.ask("health")["fenced"] == fenced  # placectl fenced nothing
    now = {h.index: hosts.raylet_pid(h) for h in hosts.hosts}
    # Ray's late verdict may land at any moment up to 26 s after a long cut's heal, and a
    # raylet Ray declared dead exits: the nodes Ray gave up by now are Ray's, read after
    # the raylets (a verdict between the two reads is counted).
    late = {n["ip"]: n["why"] for n in driver.ask("nodes")["nodes"] if n["node"] in nodes
            and not n["alive"]}  # fmt: skip
    assert all("health check" in why for why in late.values()), late
    kept = {h.index for h in hosts.hosts if h.ip not in late}
    assert {i: now[i] for i in kept} == {i: raylets[i] for i in kept}  # the same raylets
    if repaired["lost"] and not lost:  # the suspects answer again: back, and swept
        deadline = time.monotonic() + BACK_AFTER_HEAL_S
        while not [m for kind, m in driver.ask("events")["events"] if kind == "back"]:
            assert time.monotonic() < deadline, "the suspects never came back"
            time.sleep(0.5)


def test_a_raylet_killed_alone_is_fenced_at_once_on_proof(hosts, driver):
    """The raylet of a job's host killed (its host up, the port refused): the controller
    and the witnesses hear the refusal, which is proof; fenced without waiting for the
    grace, and repair() relaunches the host's ranks elsewhere in seconds."""
    before = _settled(hosts, driver)
    victim = hosts.hosts[_job_hosts(hosts, before)[0]]
    doomed = [i for i, r in enumerate(before) if r["ip"] == victim.ip]
    hosts.kill_raylet(victim)
    killed = time.monotonic()
    repaired = driver.ask("repair", timeout=120)
    # The host's workers outlive its raylet for a moment, and a repair asked that instant
    # finds every rank answering (a clean-clone run: nothing lost, 0.11 s): a job's next
    # call fails once they are gone, and it asks again. Bounded from the kill.
    while not repaired["lost"] and time.monotonic() - killed < REFUSED_REPAIR_BOUND_S:
        time.sleep(0.2)
        repaired = driver.ask("repair", timeout=120)
    assert repaired["lost"] == doomed, repaired
    assert time.monotonic() - killed < REFUSED_REPAIR_BOUND_S, repaired
    said = [m for kind, m in driver.ask("events")["events"] if kind == "fenced"]
    assert any("refuses connections" in m and victim.ip in m for m in said), said
    assert all(r["ip"] != victim.ip for r in _answering(driver))
    hosts.restart(victim)  # rebooted: free capacity again, as a new node


def test_a_host_cut_off_for_good_moves_at_once_and_is_fenced_after_the_grace(hosts, driver):
    """A job's host cut off and never healed: its ranks move in seconds, and the node is
    fenced once its grace (Ray's own detection of a silent node) is over, not before."""
    before = _settled(hosts, driver)
    victim = hosts.hosts[_job_hosts(hosts, before)[0]]
    doomed = [i for i, r in enumerate(before) if r["ip"] == victim.ip]
    hosts.cut(victim)
    cut_at = time.monotonic()
    try:
        repaired = driver.ask("repair", timeout=120)
        assert repaired["lost"] == doomed, repaired
        assert repaired["seconds"] < CUT_REPAIR_BOUND_S, repaired
        ids = set(hosts.node_ids(victim))
        assert driver.ask("health")["fenced"].keys().isdisjoint(ids)
        # Out once its grace is over (fenced by placectl), or once Ray's own health
        # checks call it dead, whichever comes first.
        deadline = cut_at + 120
        while True:
            fenced = set(driver.ask("health")["fenced"]) & ids
            dead = {n["node"] for n in driver.ask("nodes")["nodes"] if not n["alive"]} & ids
            if fenced or dead:
                break
            assert time.monotonic() < deadline, "the host was neither fenced nor given up"
            time.sleep(1.0)
        out_after = time.monotonic() - cut_at
        if not dead:
            # placectl's own fence, on silence alone: never before the grace (62 s). Ray's
            # verdict may come first and sooner: after the blip tests had cut this host,
            # its health checks failed at once instead of timing out, and Ray called it
            # dead after five of them (6.3 s); placectl then follows Ray.
            assert out_after >= 55.0, (out_after, fenced)
        assert all(r["ip"] != victim.ip for r in _answering(driver))
    finally:
        hosts.restart(victim)
