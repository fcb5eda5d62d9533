"""Ownership: only the holder of a reservation's token (or a forced call) changes it;
reading and attaching stay open. The controller on the fake cluster, through the table;
and how a client finds its token."""

from __future__ import annotations

import asyncio
import logging
import os
import stat

import pytest

from clients.owner_token import resolve_token
from controller.errors import NotOwner
from controller.state.table import RECORD, key
from tests.unit.fakes import cluster, controller, info, run, spec, stored

A, B = "alice-token", "bob-token"


def test_only_the_owner_changes_a_reservation_and_force_is_logged(caplog):
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3"), 5, token=A)
        rec = stored(fake, "j")
        assert rec.owner and A.encode() not in fake.kv[key(RECORD, "j")]  # never the token
        # attaching (the same spec) is open; changing is not
        assert info(await ctl.reserve("j", spec("0-3"), 5, token=B)).state == "ready"
        refused = [
            ctl.release("j", B),
            ctl.apply("j", spec("0-7"), 5, False, B),
            ctl.resize("j", "actor", "0-7", None, 5, False, B),
            ctl.repair("j", B),
            ctl.lease_ports("j", "actor", 0, 1, True, "p", None, B),
            ctl.release_ports("j", [1], B),
            ctl.reserve("j", spec("0-7"), 5, True, token=B),  # replace
        ]
        for call in refused:
            with pytest.raises(NotOwner, match="reserved by another client"):
                await call
        assert stored(fake, "j").uid == rec.uid and stored(fake, "j").epoch == rec.epoch
        assert await ctl.lease_ports("j", "actor", 0, 1, True, "p", None, A)
        with caplog.at_level(logging.WARNING, logger="placectl.controller"):
            assert await ctl.release("j", B, True)
        assert "release of 'j' forced" in caplog.text
        assert stored(fake, "j") is None
        await ctl.stop()

    run(go())


def test_release_all_takes_only_the_callers_unless_forced():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("alices", spec("0-3", num_nodes=4), 5, token=A)
        await ctl.reserve("bobs", spec("4-7", num_nodes=4), 5, token=B)
        await ctl.reserve("anyones", spec("8-11", num_nodes=4), 5)  # no token: anyone's
        assert await ctl.release_all(A) == ["alices", "anyones"]
        assert stored(fake, "bobs") is not None
        assert await ctl.release_all(A, True) == ["bobs"]
        await ctl.stop()

    run(go())


def test_a_queued_reservation_keeps_its_owner_when_placed():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("holder", spec("0-3", num_nodes=2), 5, token=B)
        task = asyncio.create_task(
            ctl.reserve("w", spec("0-3", num_nodes=2), 10, queue="q", token=A)
        )
        while stored(fake, "w") is None:
            await asyncio.sleep(0.005)
        with pytest.raises(NotOwner):
            await ctl.release("w", B)  # leaving someone else's place in the queue
        await ctl.release("holder", B)
        assert info(await asyncio.wait_for(task, 5)).state == "ready"
        with pytest.raises(NotOwner):  # placed, it is still A's: B may not release it
            await ctl.release("w", B)
        assert await ctl.release("w", A)
        await ctl.stop()

    run(go())


def test_a_client_finds_its_token(tmp_path, monkeypatch):
    path = tmp_path / "cfg" / "token"
    monkeypatch.setenv("PLACECTL_TOKEN_FILE", str(path))
    monkeypatch.delenv("PLACECTL_TOKEN", raising=False)
    first = resolve_token()
    assert path.read_text() == first and len(first) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert resolve_token() == first  # the same user, another process
    monkeypatch.setenv("PLACECTL_TOKEN", "from-env")
    assert resolve_token() == "from-env"
    assert resolve_token("explicit") == "explicit"
    assert not [p for p in path.parent.iterdir() if p.name != "token"]  # no leftovers


def test_the_cli_wants_force_to_release_everyones(capsys):
    from clients.cli import main

    with pytest.raises(SystemExit) as e:
        main(["release", "--all", "--address", "127.0.0.1:1"])
    assert e.value.code == 2
    assert "add --force" in capsys.readouterr().err
