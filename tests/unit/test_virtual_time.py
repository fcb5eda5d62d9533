"""The virtual-time loop the controller's unit tests run on: idle waits are skipped,
a thread's work is waited for in real time, and the controller's clock is the loop's."""

from __future__ import annotations

import asyncio
import time

from clients.testing import virtual_time
from controller.runtime import core


def test_an_hour_of_sleep_passes_at_once_and_the_clock_says_an_hour():
    async def go():
        loop = asyncio.get_running_loop()
        before, wall_before = core.now(), core.wall()
        await asyncio.sleep(3600)
        return core.now() - before, core.wall() - wall_before, loop.time() - before

    started = time.monotonic()
    passed, wall_passed, loop_passed = virtual_time.run(go())
    assert 3600 <= passed < 3660 and 3600 <= wall_passed < 3660 and loop_passed >= 3600
    assert time.monotonic() - started < 30  # generous: the point is not an hour


def test_timers_fire_in_the_order_of_their_deadlines():
    async def go():
        fired = []

        async def at(delay):
            await asyncio.sleep(delay)
            fired.append(delay)

        await asyncio.gather(*(at(d) for d in (50.0, 0.5, 7.0, 0.01, 600.0)))
        return fired

    assert virtual_time.run(go()) == [0.01, 0.5, 7.0, 50.0, 600.0]


def test_work_in_a_thread_is_waited_for_not_skipped():
    async def go():
        # A timeout longer than the thread's work never fires: the clock does not skip
        # past it while the thread is out.
        return await asyncio.wait_for(asyncio.to_thread(time.sleep, 0.3), timeout=2.0)

    virtual_time.run(go())  # raises TimeoutError if the wait were skipped


def test_outside_a_loop_the_controllers_clock_is_the_monotonic_one():
    a = time.monotonic()
    b = core.now()
    assert a <= b <= time.monotonic()
    assert abs(core.wall() - time.time()) < 1.0
