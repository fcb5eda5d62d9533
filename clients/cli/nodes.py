"""``placectl`` commands about nodes an operator takes out of placement: cordon, drain,
fence, uncordon, cordons."""

from __future__ import annotations

import time

import click

from clients.cli.app import address_option, cli, connect, emit, fmt, output_option

_FORCE = click.option(
    "--force", is_flag=True, help="Act without the operator's token (in the history)."
)
_WHY = click.option("--why", default="", help="Why, for the history and `placectl status`.")


def _said(got: dict, how: str) -> str:
    where = f"{got['ip']} ({got['node'][:12]})" if got["ip"] else got["node"][:12]
    line = f"node {where} {how}" + (f": {got['why']}" if got.get("why") else "")
    moving = got.get("moving")
    if moving:
        how = "repaired at once" if got.get("fence") else "moving off it, make before break"
        line += f"\n{how}: {', '.join(moving)}"
    return line


def _cordon(node: str, address, why: str, force: bool, output: str, drain: bool) -> None:
    got = connect(address).cordon(node, drain=drain, why=why, force=force)
    emit(output, got, lambda: _said(got, "drained" if drain else "cordoned"))


@cli.command()
@click.argument("node")
@address_option
@_WHY
@_FORCE
@output_option
def cordon(node, address, why, force, output, as_json) -> None:
    """Place no new slot on NODE (its id, 8 characters of it or more, or its address):
    no reservation, spare or repair picks it; the slots there stay. For a node due for
    maintenance, or a GPU that throws errors. Needs the operator's token
    (PLACECTL_OPERATOR_TOKEN) or --force. `placectl uncordon NODE` undoes it."""
    _cordon(node, address, why, force, fmt(output, as_json), drain=False)


@cli.command()
@click.argument("node")
@address_option
@_WHY
@_FORCE
@output_option
def drain(node, address, why, force, output, as_json) -> None:
    """Cordon NODE, and move every reservation with a slot there (with automatic repair)
    off it, make before break, as when Ray drains a node: the new slot is placed and
    ready before the old one goes, and each job moves its ranks with
    `WorkerGroup.sync()` at a step boundary. The node stays in Ray. Needs the
    operator's token (PLACECTL_OPERATOR_TOKEN) or --force."""
    _cordon(node, address, why, force, fmt(output, as_json), drain=True)


@cli.command()
@click.argument("node")
@address_option
@_WHY
@_FORCE
@output_option
def fence(node, address, why, force, output, as_json) -> None:
    """Declare NODE broken now (a GPU throwing Xid errors, a machine about to be
    pulled): cordon it, then tell Ray it is dead, so its raylet exits and every process
    there ends; every reservation with a slot there is repaired at once, as for a node
    that died, and `WorkerGroup.repair()` relaunches its ranks. Not the head, nor the
    controller's node. Needs the operator's token (PLACECTL_OPERATOR_TOKEN) or --force."""
    output = fmt(output, as_json)
    got = connect(address).fence(node, why=why, force=force)
    emit(output, got, lambda: _said({**got, "why": why}, "fenced, told dead to Ray"))


@cli.command()
@click.argument("node")
@address_option
@_FORCE
@output_option
def uncordon(node, address, force, output, as_json) -> None:
    """Let NODE take new slots again (reservations moved off it stay where they are).
    Needs the operator's token (PLACECTL_OPERATOR_TOKEN) or --force."""
    output = fmt(output, as_json)
    got = connect(address).uncordon(node, force=force)
    emit(output, got, lambda: _said({**got, "why": "", "moving": []}, "uncordoned"))


@cli.command()
@address_option
@output_option
def cordons(address, output, as_json) -> None:
    """List the nodes out of placement: cordoned or drained, since when, and why."""
    output = fmt(output, as_json)
    got = connect(address).cordons()

    def table() -> str:
        if not got:
            return "no node is cordoned"
        now = time.time()
        return "\n".join(
            f"{_said({**c, 'moving': []}, 'drained' if c['drain'] else 'cordoned')} "
            f"({now - c['at']:.0f}s ago)"
            for c in got
        )

    emit(output, got, table)
