"""The driver's verdict (clients.verdict.settle) against a real controller on the fake
cluster: the node verdicts come from the controller's own ``verdicts`` call, run on an
event loop of its own as a Ray actor runs it; the ranks' answers and Ray's actor table
are what each case makes of them. No Ray."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest

from clients.verdict import ALIVE, MOVED, final, looks, settle, wait_placed
from controller.errors import UndecidedNodes
from controller.runtime.core.settings import FAST
from controller.runtime.edge.answers import DENIED, OK, REFUSED, SILENT
from controller.state.events import Event
from tests.unit.fakes import cluster, controller, spec, stored

SETTINGS = msgspec.structs.replace(FAST, suspect_after=0.3, liveness_period=0.02)


class Cluster:
    """A controller on the fake cluster, served from a thread as an actor is."""

    def __init__(self) -> None:
        self.fake = cluster(gpu_nodes=3)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.ctl = self.call(self._start())
        self.slots = [s.node_id for s in stored(self.fake, "j").slots]
        # ranks 0-3 on the first slot's node, 4-7 on the second's
        self.nodes = [self.slots[0]] * 4 + [self.slots[1]] * 4

    async def _start(self):
        ctl = await controller(self.fake, SETTINGS)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        return ctl

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def in_loop(self, fn):
        async def go():
            return fn()

        return self.call(go())

    def verdicts(self) -> dict[str, str]:
        return self.call(self.ctl.verdicts("j", sorted(set(self.nodes))))

    def dead_nodes(self) -> set[str]:
        return self.in_loop(
            lambda: {n for n, x in self.fake.nodes_by_id.items() if not x.info.alive}
        )

    def close(self) -> None:
        self.call(self.ctl.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def world():
    w = Cluster()
    yield w
    w.close()


def _settle(world, answer_of, dead, within=5.0, said=None):
    return settle(
        list(range(8)),
        world.nodes,
        ask_nodes=world.verdicts,
        ask_ranks=lambda ranks: {r: answer_of(r) for r in ranks},
        dead=dead,
        within=within,
        say=(said.append if said is not None else lambda m: None),
    )


def test_a_refusal_is_never_taken_for_an_answer():
    assert not final(DENIED, "silent") and not final(DENIED, "unknown")
    assert not final(OK, "dead")  # its node was fenced: lost, whatever it says
    assert final(DENIED, "alive") and final(OK, "alive") and final(OK, "unknown")
    assert not final(OK, "silent") and not final(OK, "suspected")  # its verdict comes
    assert not final(SILENT, "alive") and not final(REFUSED, "alive")


def test_ranks_refusing_placectl_on_a_node_that_died_wait_for_rays_verdict(world):
    """The refused-token race: a node dies abruptly while its workers, for a moment
    alive, refuse placectl's credentials. Their answers say nothing; the controller's
    verdict on the node (its raylet refuses connections: fenced) and then Ray's actor
    table decide, and repair() relaunches them."""
    lost = world.slots[0]
    world.in_loop(lambda: world.fake.crash_node(lost))  # the raylet is gone
    dead_after = {}

    def dead():
        gone = world.dead_nodes()
        if lost in gone:  # Ray's actor table follows the node's death a moment later
            dead_after.setdefault("at", time.monotonic() + 0.3)
        if time.monotonic() < dead_after.get("at", float("inf")):
            return set()
        return {r for r in range(8) if world.nodes[r] in gone}

    started = time.monotonic()
    hung = _settle(world, lambda r: DENIED, dead)
    assert hung == []
    assert lost in world.fake.fenced  # the controller's verdict, not a guess
    assert dead() == {0, 1, 2, 3}  # it returned once Ray agreed, not before
    assert time.monotonic() - started < 5.0  # and well before `within`


def test_ranks_refusing_placectl_on_a_live_node_are_not_waited_for(world):
    started = time.monotonic()
    assert _settle(world, lambda r: DENIED, lambda: set()) == []
    assert time.monotonic() - started < 1.0
    assert world.fake.fenced == {}


def test_a_silent_rank_on_a_live_node_is_hung(world):
    said = []
    hung = _settle(world, lambda r: SILENT if r == 5 else OK, lambda: set(), within=1.5, said=said)
    assert hung == [5]
    assert any("have no verdict yet" in m for m in said)


def test_silent_ranks_while_the_controller_is_cut_off_are_never_called_hung_nor_kept(world):
    """Nothing is known of them: none is killed as hung, and none is reported kept
    either; after the wait, the nodes without a verdict are named."""
    world.in_loop(lambda: world.fake.cut.add(world.fake.own_node()))
    started = time.monotonic()
    with pytest.raises(UndecidedNodes) as raised:
        settle(
            list(range(8)),
            world.nodes,
            ask_nodes=world.verdicts,
            ask_ranks=lambda ranks: dict.fromkeys(ranks, SILENT),
            dead=lambda: set(),
            within=0.5,
            say=lambda m: None,
            lost_within=1.5,
        )
    assert time.monotonic() - started >= 1.5  # the whole wait, not `within`
    assert sorted(raised.value.nodes) == sorted(set(world.slots[:2]))
    assert "(unknown)" in str(raised.value) and "nothing was relaunched" in str(raised.value)
    assert world.fake.fenced == {}
    assert set(world.verdicts().values()) == {"unknown"}


def test_silent_ranks_on_a_cut_off_node_wait_for_its_verdict_then_are_lost(world):
    """A node cut off while the controller is fine: its ranks are silent, and the node
    has no verdict at first; once witnesses agree it is suspected, the job's slot moves
    off it, and its ranks are lost (``moved``), the node kept (not fenced)."""
    cut = world.slots[0]
    world.in_loop(lambda: world.fake.cut.add(cut))
    hung = settle(
        list(range(8)),
        world.nodes,
        ask_nodes=world.verdicts,
        ask_ranks=lambda ranks: {r: SILENT if world.nodes[r] == cut else OK for r in ranks},
        dead=lambda: set(),
        within=0.2,
        say=lambda m: None,
        lost_within=10.0,
    )
    assert hung == []  # never taken for hung: their node had no verdict yet
    assert world.verdicts()[cut] == "moved"
    assert world.fake.fenced == {}


def test_ranks_that_answer_again_on_a_node_still_silent_wait_for_its_verdict(world):
    """A link back a moment before the suspicion (found by chaos, a flapping host): the
    ranks answer the driver again while the node is still silent to the controller,
    whose suspicion then moves the slot and ends them. repair() must not report them
    kept on the silence: it waits for the node's verdict (here the move), so that the
    ranks it reports are the ranks the controller's move left."""
    cut = world.slots[0]
    world.in_loop(lambda: world.fake.cut.add(cut))
    deadline = time.monotonic() + 5
    while world.verdicts()[cut] != "silent":  # repair() called during the silence
        assert time.monotonic() < deadline
        time.sleep(0.01)
    seen: dict[str, str] = {}
    hung = settle(
        list(range(8)),
        world.nodes,
        ask_nodes=looks(_Asked(world), "j", world.nodes, seen),
        ask_ranks=lambda ranks: dict.fromkeys(ranks, OK),  # every rank answers
        dead=lambda: set(),
        within=10.0,
        say=lambda m: None,
    )
    assert hung == [] and seen[cut] == MOVED, seen  # judged on the move, not before


class _Asked:
    """The controller as a driver's reservation holds it: its calls, from the driver's
    thread."""

    def __init__(self, world) -> None:
        self.world = world

    def verdicts(self, job, nodes, unless=None, wait_s=0.0):
        return self.world.call(self.world.ctl.verdicts(job, nodes, unless=unless, wait_s=wait_s))


def test_a_cut_nodes_ranks_are_judged_the_moment_its_slot_moves(world):
    """A silent rank takes a second to be asked (its health check times out). Once the
    job's slot has moved off the cut node, its ranks are lost whatever they answer: the
    driver learns of the move from a look that waits for it, and does not ask them
    again. It used to learn at its next look after asking every rank (a second), then
    ask the lost ones once more (another): a cut host's ranks answered 5.2-7.7 s after
    the cut on real hosts, the move made at 2.5-3.4 s."""
    cut = world.slots[0]

    def ask_ranks(ranks):
        if any(world.nodes[r] == cut for r in ranks):
            time.sleep(1.0)  # the silent ones' health checks time out
        return {r: SILENT if world.nodes[r] == cut else OK for r in ranks}

    world.in_loop(lambda: world.fake.cut.add(cut))
    seen: dict[str, str] = {}
    hung = settle(
        list(range(8)),
        world.nodes,
        ask_nodes=looks(_Asked(world), "j", world.nodes, seen),
        ask_ranks=ask_ranks,
        dead=lambda: set(),
        within=10.0,
        say=lambda m: None,
    )
    judged = time.time()
    assert hung == [] and seen[cut] == MOVED
    told = msgspec.msgpack.decode(world.call(world.ctl.events("j")), type=list[Event])
    (moved,) = [e.at for e in told if e.kind == "repaired"]  # the commit that moved it
    assert judged - moved < 0.5, judged - moved


def test_a_group_whose_ranks_all_answer_is_judged_at_once(world):
    """The looks that wait for a change are for ranks that do not answer: a repair() of
    a group that lost nothing returns in milliseconds, not after a look's second."""
    started = time.monotonic()
    hung = settle(
        list(range(8)),
        world.nodes,
        ask_nodes=looks(_Asked(world), "j", world.nodes, {}),
        ask_ranks=lambda ranks: dict.fromkeys(ranks, OK),
        dead=lambda: set(),
        within=10.0,
        say=lambda m: None,
    )
    assert hung == [] and time.monotonic() - started < 0.5, time.monotonic() - started


def test_a_look_that_waits_for_a_change_answers_after_its_wait_when_none_comes(world):
    asked = _Asked(world)
    now = asked.verdicts("j", world.nodes)
    started = time.monotonic()
    assert asked.verdicts("j", world.nodes, now, 0.3) == now
    assert 0.3 <= time.monotonic() - started < 2.0
    assert asked.verdicts("j", world.nodes, {**now, world.slots[0]: "moved"}, 5.0) == now


def test_a_rank_that_still_answers_on_a_fenced_node_is_lost(world):
    fenced = world.slots[1]
    world.in_loop(lambda: world.fake.crash_node(fenced))
    deadline = time.monotonic() + 10
    while fenced not in world.dead_nodes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fenced in world.fake.fenced
    table_at = time.monotonic() + 0.5  # Ray's actor table agrees half a second later

    def dead():
        return {4, 5, 6, 7} if time.monotonic() >= table_at else set()

    # Its workers still answer for a moment (their raylet died first): lost all the same.
    hung = _settle(world, lambda r: OK, dead)
    assert hung == [] and time.monotonic() >= table_at


def test_a_node_whose_fence_is_refused_is_waited_for_until_ray_calls_it_dead(world):
    """A secured cluster refuses placectl's fence: the node whose raylet refuses
    connections stays alive to Ray until its own health checks give up. Its ranks
    (refusing placectl's credentials too) are lost all the same: settle waits past
    ``within`` for Ray's verdict, since nothing can be relaunched before it."""
    from controller.runtime.edge.answers import CallDenied

    lost_node = world.slots[0]
    world.in_loop(lambda: setattr(world.fake, "fence_refusal", CallDenied("UNAUTHENTICATED")))
    world.in_loop(lambda: world.fake.crash_node(lost_node))
    ray_gives_up = time.monotonic() + 2.5  # Ray's own health checks, later than within

    def dead():
        if time.monotonic() >= ray_gives_up:
            world.in_loop(lambda: world.fake.nodes_by_id[lost_node].info.alive and
                          world.fake.kill_node(lost_node))  # fmt: skip
            return {0, 1, 2, 3}
        return set()

    hung = settle(
        list(range(8)),
        world.nodes,
        ask_nodes=world.verdicts,
        ask_ranks=lambda ranks: dict.fromkeys(ranks, DENIED),
        dead=dead,
        within=1.0,
        say=lambda m: None,
        lost_within=30.0,
    )
    assert hung == [] and time.monotonic() >= ray_gives_up
    assert world.fake.fenced == {}  # placectl fenced nothing: Ray decided


class _Placement:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id


class _Assignment:
    def __init__(self, node_id: str) -> None:
        self.placement = _Placement(node_id)


class _Reservation:
    """What wait_placed reads of a reservation: a record that stays degraded (another
    component's lost node waits for one to join), at ``epoch``, with ``component``'s
    slots on ``nodes``; Ray reports ``dead`` dead."""

    job = "j"

    def __init__(self, epoch: int, nodes: list[str], dead: set[str]) -> None:
        class Info:
            state, reason = "degraded", "slot 2 lost node n2; waiting for one to join"

        self.info = Info()
        self.info.epoch = epoch
        self.nodes, self.dead = nodes, dead
        self.controller = self

    def wait_ready(self, timeout, progress=None):
        from controller.errors import ReservationTimeout

        time.sleep(min(timeout, 0.01))
        raise ReservationTimeout("not ready")

    def assignments(self, component, allow_degraded=False):
        assert allow_degraded
        return [_Assignment(n) for n in self.nodes]

    def dead_nodes(self, nodes):
        return set(nodes) & self.dead


def test_a_group_whose_own_slots_were_placed_does_not_wait_for_the_rest():
    # repaired in part (epoch 2 after the group's 1), its slots on live nodes: at once
    res = _Reservation(epoch=2, nodes=["spare", "n3"], dead={"n1", "n2"})
    wait_placed(res, "actor", 1, {"n1": "dead", "n3": ALIVE}, timeout=5, progress=print)


@pytest.mark.parametrize(
    ("epoch", "nodes", "verdicts"),
    [
        (1, ["spare", "n3"], {}),  # no repair since the group's epoch: not its slots yet
        (2, ["n1", "n3"], {}),  # one of its slots still on a node Ray reports dead
        (2, ["n4", "n3"], {"n4": MOVED}),  # ... or on one the verdicts found not alive
    ],
)
def test_a_group_whose_own_slots_are_not_placed_waits_and_says_why(epoch, nodes, verdicts):
    from controller.errors import ReservationTimeout

    res = _Reservation(epoch=epoch, nodes=nodes, dead={"n1", "n2"})
    with pytest.raises(ReservationTimeout, match=r"not ready after 0.3s: it is degraded \(slot 2"):
        wait_placed(res, "actor", 1, verdicts, timeout=0.3, progress=print)
