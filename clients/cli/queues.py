"""``placectl`` commands about queues and history: queue, quota, operator, events."""

from __future__ import annotations

import time

import click

from clients.cli.app import address_option, cli, connect, emit, encode, fmt, output_option, watch
from clients.queue import OPERATOR_TOKEN_ENV, operator_token


@cli.command("queue")
@address_option
@output_option
@click.option(
    "--watch", "watch_", is_flag=True, help="Redraw whenever the queue changes (Ctrl-C ends)."
)
@click.option("--interval", type=float, default=1.0, show_default=True, help="With --watch.")
def queue_cmd(address, output, as_json, watch_, interval) -> None:
    """Show the queued reservations in admission order: position, priority, how long
    each has waited, what it asks for, and what it waits for (and whose)."""
    from clients.render_queues import render_queue

    output = fmt(output, as_json)
    ctl = connect(address)

    def show() -> str:
        entries = ctl.queue()
        return render_queue(entries, time.time()) if output == "table" else encode(entries, output)

    if watch_:
        watch(show, interval, output)
    else:
        click.echo(show())


def _limits(items: tuple[str, ...]) -> dict[str, float]:
    parsed = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            parsed[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise click.UsageError(f"quota {item!r}: expected RESOURCE=NUMBER, e.g. GPU=16")
    return parsed


@cli.command()
@click.argument("queue", required=False)
@click.argument("limits", nargs=-1)
@address_option
@click.option("--clear", is_flag=True, help="Remove QUEUE's quota.")
@click.option(
    "--force", is_flag=True, help="Change it without the operator's token (in the history)."
)
@output_option
def quota(queue, limits, address, clear, force, output, as_json) -> None:
    """Show every queue's quota beside what it uses and how many wait, or set QUEUE's:
    `placectl quota research GPU=16`. Setting needs the operator's token
    (PLACECTL_OPERATOR_TOKEN; see `placectl operator`) or --force. Reservations already
    placed keep their resources; admissions respect it. Reservations made without
    --queue are shown as "(none)": no quota limits them."""
    from clients.render_queues import render_quotas

    output = fmt(output, as_json)
    ctl = connect(address)
    if queue is None:
        if limits or clear:
            raise click.UsageError("name the QUEUE whose quota to set")
        usage = ctl.queues()
        emit(output, usage, lambda: render_quotas(usage))
        return
    parsed = _limits(limits)
    if not parsed and not clear:
        raise click.UsageError("give RESOURCE=NUMBER limits, or --clear")
    if parsed and clear:
        raise click.UsageError("give either RESOURCE=NUMBER limits or --clear, not both")
    got = ctl.set_quota(queue, force=force, **parsed)
    shown = ", ".join(f"{k}={v:g}" for k, v in sorted(got.items())) or "no quota"
    emit(output, {"queue": queue, "limits": got}, lambda: f"{queue}: {shown}")


@cli.command()
@address_option
@click.option("--force", is_flag=True, help="Replace another operator's token.")
@output_option
def operator(address, force, output, as_json) -> None:
    """Make the token in PLACECTL_OPERATOR_TOKEN this controller's operator token:
    quota changes then need it (or --force). Kept in the table; replacing another
    operator's token needs --force. Both are written to the event history."""
    token = operator_token()
    if not token:
        raise click.UsageError(f"set {OPERATOR_TOKEN_ENV} to the operator's token first")
    hashed = connect(address).set_operator(token, force=force)
    emit(
        fmt(output, as_json),
        {"operator": hashed},
        lambda: f"operator token set (hash {hashed}); quota changes now need it",
    )


@cli.command()
@click.argument("job", required=False)
@address_option
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@output_option
@click.option(
    "--watch", "watch_", is_flag=True, help="Go on printing new events as they come (Ctrl-C ends)."
)
@click.option("--interval", type=float, default=1.0, show_default=True, help="With --watch.")
def events(job, address, limit, output, as_json, watch_, interval) -> None:
    """What happened to JOB's reservation (or to all, and to quotas), oldest first:
    reserved, degraded and repaired with the cause, moved off draining nodes, queued,
    admitted, preempted, applied, released, and who acted (the controller, or a client
    by its token's hash). The history is bounded (the newest 1000 by default) and kept
    with the table across controller restarts."""
    from clients.render_queues import render_events

    output = fmt(output, as_json)
    ctl = connect(address)
    found = ctl.events(job, limit=limit)
    if not watch_:
        emit(output, found, lambda: render_events(found))
        return
    if output == "table":
        click.echo(render_events(found))
    else:
        _each(found, output)
    shown, last = bool(found), found[-1].seq if found else 0
    try:
        while True:  # follow: only what is new, as `kubectl get events -w` does
            time.sleep(interval)
            new = ctl.events(job, after=last, limit=10_000)
            if not new:
                continue
            if output == "table":
                click.echo(render_events(new, header=not shown))
            else:
                _each(new, output)
            shown, last = True, new[-1].seq
    except KeyboardInterrupt:  # the way a watch ends: not an error
        return


def _each(found, output: str) -> None:
    """Events one by one, as a follower reads them: json one per line, yaml documents."""
    for e in found:
        click.echo(encode(e, "json") if output == "json" else "---\n" + encode(e, output))
