"""The stewards' guarantees (controller.runtime.core.stewards), each against real asyncio tasks:
order, no overlap, cancellation with its rollback waited out, errors kept to their
poster, the poster's context, nothing left when idle or stopped."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from controller.errors import ReservationCancelled, UnknownReservation
from controller.runtime.core import Tasks
from controller.runtime.core.stewards import Stewards, Trigger
from tests.unit.fakes import cluster, controller, run, spec, stored, until

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="")


def test_steps_of_one_job_run_one_at_a_time_in_order_and_jobs_at_once():
    async def go():
        stewards, log, gate = Stewards(Tasks()), [], asyncio.Event()

        def step(job: str, n: int):
            async def body() -> int:
                log.append(("start", job, n))
                await gate.wait()
                log.append(("end", job, n))
                return n

            return body

        posted = [
            asyncio.ensure_future(stewards.run(job, Trigger.APPLY, step(job, n)))
            for n in range(3)
            for job in ("a", "b")
        ]
        await until(lambda: len(log) == 2)
        assert sorted(log) == [("start", "a", 0), ("start", "b", 0)]  # the jobs at once
        assert stewards.doing() == {"a": ["apply"] * 3, "b": ["apply"] * 3}
        gate.set()
        assert await asyncio.gather(*posted) == [0, 0, 1, 1, 2, 2]
        for job in ("a", "b"):
            mine = [(what, n) for what, j, n in log if j == job]
            assert mine == [(w, n) for n in range(3) for w in ("start", "end")]
        assert not stewards.busy("a") and stewards.doing() == {}

    run(go())


def test_a_cancelled_poster_cancels_its_step_and_the_next_waits_for_its_rollback():
    async def go():
        stewards, log = Stewards(Tasks()), []
        started = asyncio.Event()

        async def long() -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)  # the rollback takes time
                log.append("rolled back")
                raise

        async def never() -> None:
            log.append("the queued step ran")

        async def after() -> None:
            log.append("next")

        first = asyncio.ensure_future(stewards.run("j", Trigger.RESERVE, long))
        await started.wait()
        queued = asyncio.ensure_future(stewards.run("j", Trigger.LEASE, never))
        nxt = asyncio.ensure_future(stewards.run("j", Trigger.RELEASE, after))
        await asyncio.sleep(0)
        queued.cancel()
        first.cancel()
        await nxt
        assert log == ["rolled back", "next"]
        for cancelled in (first, queued):
            with pytest.raises(asyncio.CancelledError):
                await cancelled

    run(go())


def test_an_idle_steward_runs_the_step_in_its_posters_task_a_busy_one_in_its_own():
    async def go():
        stewards, gate = Stewards(Tasks()), asyncio.Event()

        async def where() -> asyncio.Task | None:
            await gate.wait()
            return asyncio.current_task()

        async def post() -> tuple[asyncio.Task | None, asyncio.Task | None]:
            return asyncio.current_task(), await stewards.run("j", Trigger.LEASE, where)

        first, second = asyncio.ensure_future(post()), asyncio.ensure_future(post())
        await until(lambda: stewards.doing() == {"j": ["lease", "lease"]})
        gate.set()
        (poster1, ran1), (poster2, ran2) = await first, await second
        assert ran1 is poster1 and ran2 is not poster2  # the second waited in the mailbox
        stewards.stop()
        with pytest.raises(asyncio.CancelledError):
            await stewards.run("j", Trigger.LEASE, where)  # a stopped controller takes none

    run(go())


def test_a_failing_step_fails_its_poster_only():
    async def go():
        stewards = Stewards(Tasks())

        async def bad() -> None:
            raise ValueError("no")

        async def good() -> str:
            return "yes"

        failing = asyncio.ensure_future(stewards.run("j", Trigger.APPLY, bad))
        passing = asyncio.ensure_future(stewards.run("j", Trigger.APPLY, good))
        with pytest.raises(ValueError, match="no"):
            await failing
        assert await passing == "yes"

    run(go())


def test_a_step_runs_with_its_posters_context():
    async def go():
        stewards = Stewards(Tasks())

        async def who() -> str:
            return WHO.get()

        async def as_(name: str) -> str:
            WHO.set(name)
            return await stewards.run("j", Trigger.RELEASE, who)

        assert await asyncio.gather(as_("alice"), as_("bob")) == ["alice", "bob"]

    run(go())


def test_a_check_skips_a_busy_job_and_stop_leaves_no_poster_waiting():
    async def go():
        tasks = Tasks()
        stewards = Stewards(tasks)
        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.Event().wait()

        running = asyncio.ensure_future(stewards.run("j", Trigger.REPAIR, forever))
        waiting = asyncio.ensure_future(stewards.run("j", Trigger.CHECK, forever))
        await started.wait()
        assert stewards.busy("j") and not stewards.busy("k")
        assert stewards.doing() == {"j": ["repair", "check"]}
        stewards.stop()  # the controller stops
        tasks.stop()
        for poster in (running, waiting):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(poster, 5)
        await until(lambda: tasks.keys("steward") == set())
        assert not stewards.busy("j")

    run(go())


def test_the_controller_changes_a_job_only_in_its_stewards_steps_and_shows_them():
    """A reserve that waits its turn in the queue is the job's running step; a lease
    posted meanwhile waits behind it (health shows both); a release cancels the reserve,
    then runs; nothing waits after."""

    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("holder", spec("0-7"), 5)
        waiting = asyncio.ensure_future(ctl.reserve("j", spec("0-3"), 30, queue="q"))
        await until(lambda: (r := stored(fake, "j")) is not None and r.state == "queued")
        lease = asyncio.ensure_future(ctl.lease_ports("j", "actor", 0, 1, False, None, "r"))
        await until(lambda: ctl.ops.ctx.stewards.doing().get("j") == ["reserve", "lease"])
        assert (await ctl.health())["steps"] == {"j": ["reserve", "lease"]}
        assert await ctl.release("j") is True
        with pytest.raises(ReservationCancelled):
            await waiting
        with pytest.raises(UnknownReservation):
            await lease  # it ran after the reserve's rollback: the job was gone
        assert (await ctl.health())["steps"] == {} and stored(fake, "j") is None
        await ctl.stop()

    run(go())
