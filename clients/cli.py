"""The ``placectl`` command line.

Every failure prints one line, ``placectl: error: ...``, naming the input at fault, and
exits non-zero (2 for bad input); ``placectl --debug ...`` shows the traceback behind it.
"""

from __future__ import annotations

import json
import sys
import time

import click
import msgspec

from clients import exit_codes
from controller import ClusterView, ComponentPlacement, PlacementError, load_spec
from controller.errors import ClusterUnavailable, TableUnreadable
from controller.planning.cluster import load_cluster_view
from controller.version import version

_DEBUG = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version(), "--version", prog_name="placectl", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show the traceback behind an error.")
def cli(debug: bool) -> None:
    """placectl: placement controller for RL post-training on Ray."""
    global _DEBUG
    _DEBUG = debug


def _dry_run_view(spec, nodes, gpus_per_node) -> ClusterView:
    nodes = spec.num_nodes if nodes is None else nodes
    gpus_per_node = spec.num_gpus_per_node if gpus_per_node is None else gpus_per_node
    if gpus_per_node is None:
        from clients.discovery import running_cluster_view

        view = running_cluster_view(spec.accelerator)
        if view is not None:
            return view
        raise click.UsageError(
            "no Ray cluster is running to take the accelerators per node from; give "
            "--gpus-per-node N (or --cluster nodes.yaml for uneven nodes)"
        )
    if nodes < 1 or gpus_per_node < 0:
        raise click.UsageError(
            f"--nodes {nodes} --gpus-per-node {gpus_per_node}: need nodes >= 1, gpus >= 0"
        )
    return ClusterView.uniform(num_nodes=nodes, gpus_per_node=gpus_per_node)


@cli.command()
@click.argument("config")
@click.option("--nodes", type=int, help="Number of nodes (default: cluster.num_nodes).")
@click.option(
    "--gpus-per-node",
    type=int,
    help="Accelerators per node (default: the running cluster's, else cluster.num_gpus_per_node).",
)
@click.option(
    "--cluster",
    "cluster_file",
    help="YAML list of nodes (num_gpus, resources, labels, count) for uneven clusters.",
)
@click.option("--json", "as_json", is_flag=True, help="Print placements as JSON.")
def plan(config, nodes, gpus_per_node, cluster_file, as_json) -> None:
    """Dry run: show where every process of CONFIG would go. Needs no cluster."""
    spec = load_spec(config)
    if cluster_file:
        if nodes is not None or gpus_per_node is not None:
            raise click.UsageError("give either --cluster or --nodes/--gpus-per-node, not both")
        view = load_cluster_view(cluster_file)
    else:
        view = _dry_run_view(spec, nodes, gpus_per_node)
    cp = ComponentPlacement(spec, view)
    if as_json:
        click.echo(json.dumps(cp.to_dict()))
    else:
        from clients.render import render_plan

        click.echo(render_plan(cp))


address_option = click.option(
    "--address",
    default="auto",
    show_default=True,
    help="Ray cluster address (default: the running cluster, as `ray status` finds it).",
)


force_option = click.option(
    "--force", is_flag=True, help="Act on another client's reservation (logged by the controller)."
)


def _connect(address: str, start: bool = False):
    import ray

    import clients

    try:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        return clients.connect(address=address, start=start)
    except ConnectionError as e:
        raise ClusterUnavailable(
            f"cannot reach a Ray cluster at {address!r} ({e}); start one with `ray start --head`"
        ) from None


@cli.command()
@address_option
def start(address) -> None:
    """Start the controller on the cluster's head node (get-or-create; safe to repeat)."""
    ctl = _connect(address, start=True)
    click.echo(f"placectl controller {ctl.name!r} is running ({len(ctl.list())} reservation(s))")
    _warn_head(ctl.health())


@cli.command()
@address_option
@click.option("--release-all", is_flag=True, help="Release every reservation first.")
@force_option
def stop(address, release_all, force) -> None:
    """Stop the controller. Reservations stay (a new controller picks them up) unless
    --release-all (which needs --force: other clients' reservations go too)."""
    if release_all and not force:
        raise click.UsageError("--release-all releases other clients' reservations: add --force")
    ctl = _connect(address)
    if release_all:
        released = ctl.release_all(force=True)
        click.echo(f"released {len(released)} reservation(s)")
    ctl.stop()
    click.echo("placectl controller stopped")


def _warn_head(health: dict) -> None:
    """Say, before it happens, what a head loss would cost on this cluster."""
    if health.get("gcs_store") == "memory":
        click.echo(
            "warning: Ray's GCS keeps this cluster's tables in memory (no GCS fault "
            "tolerance): if the head node is lost, every reservation, placement group and "
            "worker is lost with it. Start the head with RAY_REDIS_ADDRESS=<redis host:port> "
            "to keep them across a head restart.",
            err=True,
        )


def _status_text(ctl, job, as_json) -> str:
    import msgspec

    from clients.render import render_reservation, render_reservations

    if job is None:
        infos = ctl.list()
        return msgspec.json.encode(infos).decode() if as_json else render_reservations(infos)
    res = ctl.reservation(job)
    assignments = (
        {name: res.assignments(name, allow_degraded=True) for name in res.components}
        if res.info.state in ("ready", "degraded")
        else {}
    )
    if as_json:
        return msgspec.json.encode({"reservation": res.info, "assignments": assignments}).decode()
    return render_reservation(res.info, assignments)


@cli.command()
@click.argument("job", required=False)
@address_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Redraw whenever the state changes (Ctrl-C ends).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="With --watch.")
def status(job, address, as_json, watch, interval) -> None:
    """List reservations, or show JOB's map with real IPs and physical accelerator ids."""
    ctl = _connect(address)
    health = ctl.health()
    if health.get("refusal"):
        raise TableUnreadable(
            f"the controller refuses to act: the reservation table cannot be read: "
            f"{health['refusal']}"
        )
    _warn_head(health)
    text = _status_text(ctl, job, as_json)
    if not as_json and not job:
        text = f"controller {ctl.name}: placectl {health.get('version', 'unknown')}\n{text}"
    click.echo(text)
    last = text
    while watch:
        time.sleep(interval)
        text = _status_text(ctl, job, as_json)
        if text != last:
            click.echo(f"\n--- {time.strftime('%H:%M:%S')}")
            click.echo(text)
            last = text


@cli.command()
@click.argument("job")
@click.argument("config")
@address_option
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--replace", is_flag=True, help="Replace a reservation with another spec.")
@click.option(
    "--repair",
    type=click.Choice(["auto", "manual"]),
    default="auto",
    show_default=True,
    help="Replace a lost node's slot at once, or wait for `placectl repair`.",
)
@click.option("--queue", default="", help="Wait in this queue, placed whole when it fits.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher goes first.")
@click.option("--preemptible", is_flag=True, help="May be taken back for higher priority.")
@force_option
def reserve(
    job, config, address, timeout_s, replace, repair, queue, priority, preemptible, force
) -> None:
    """Reserve CONFIG's resources for JOB (idempotent). Waits, with progress, until the
    cluster can place it or the timeout passes; Ctrl-C cancels it (and leaves the queue)."""
    from clients.render import node_count

    spec = load_spec(config)
    ctl = _connect(address, start=True)
    res = ctl.reserve(
        job,
        spec,
        timeout_s=timeout_s,
        replace=replace,
        repair=repair,
        queue=queue,
        priority=priority,
        force=force,
        preemptible=preemptible,
    )
    info = res.info
    click.echo(
        f"{job}: {info.state}, epoch {info.epoch}, {node_count(info)} node(s), "
        f"{info.num_accelerators} {info.accelerator}, components "
        + ", ".join(f"{n} x{w}" for n, w in info.components.items())
    )


@cli.command()
@click.argument("job")
@click.argument("config")
@address_option
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--plan", "dry_run", is_flag=True, help="Only show what would change.")
@force_option
def apply(job, config, address, timeout_s, dry_run, force) -> None:
    """Give the live reservation JOB the configuration CONFIG, touching only what
    changes: unchanged slots and ranks stay, the rest is made or removed. All or
    nothing. --plan shows, per component, the ranks that stay, move, start and stop."""
    from clients.render import render_apply

    spec = load_spec(config)
    summary = _connect(address).apply(job, spec, timeout_s=timeout_s, plan=dry_run, force=force)
    click.echo(render_apply(summary))


@cli.command()
@click.argument("job")
@click.argument("component")
@click.argument("placement", required=False)
@click.option("--node-group", "node_group", multiple=True, help="Move to these node groups.")
@address_option
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--plan", "dry_run", is_flag=True, help="Only show what would change.")
@force_option
def resize(job, component, placement, node_group, address, timeout_s, dry_run, force) -> None:
    """Place COMPONENT of JOB anew: a new PLACEMENT string (rollout 0-7 -> 0-15),
    --node-group to move it, or both; an apply of one component."""
    from clients.render import render_apply

    groups = list(node_group) or None
    summary = _connect(address).resize(
        job, component, placement, groups, timeout_s=timeout_s, plan=dry_run, force=force
    )
    click.echo(render_apply(summary))


@cli.command()
@click.argument("job")
@address_option
@force_option
def repair(job, address, force) -> None:
    """Replace JOB's lost node slots now (reservations made with --repair manual wait
    for this)."""
    info = _connect(address).repair(job, force=force)
    click.echo(
        f"{job}: {info.state}, epoch {info.epoch}" + (f" ({info.reason})" if info.reason else "")
    )


@cli.command()
@click.argument("job", required=False)
@address_option
@click.option("--all", "all_", is_flag=True, help="Release every reservation (needs --force).")
@force_option
def release(job, address, all_, force) -> None:
    """Release JOB's reservation (idempotent), or every one with --all --force. Another
    client's reservation needs --force."""
    if bool(job) == all_:
        raise click.UsageError("give either JOB or --all")
    if all_ and not force:
        raise click.UsageError("--all releases other clients' reservations too: add --force")
    ctl = _connect(address)
    if all_:
        done = ctl.release_all(force=True)
        click.echo(
            f"released {len(done)} reservation(s)" + (f": {', '.join(done)}" if done else "")
        )
    else:
        gone = ctl.release(job, force=force)
        click.echo(f"released {job}" if gone else f"{job}: no such reservation")


@cli.command("queue")
@address_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def queue_cmd(address, as_json) -> None:
    """Show the queued reservations in admission order: position, priority, how long
    each has waited, what it asks for, and what it waits for (and whose)."""
    from clients.render import render_queue

    entries = _connect(address).queue()
    if as_json:
        click.echo(json.dumps([msgspec.to_builtins(e) for e in entries]))
    else:
        click.echo(render_queue(entries, time.time()))


@cli.command()
@click.argument("queue", required=False)
@click.argument("limits", nargs=-1)
@address_option
@click.option("--clear", is_flag=True, help="Remove QUEUE's quota.")
def quota(queue, limits, address, clear) -> None:
    """Show every queue's quota, or set QUEUE's: `placectl quota research GPU=16`.
    Reservations already placed keep their resources; admissions respect it."""
    ctl = _connect(address)
    if queue is None:
        quotas = ctl.quotas()
        for name in sorted(quotas):
            click.echo(
                f"{name}: " + ", ".join(f"{k}={v:g}" for k, v in sorted(quotas[name].items()))
            )
        if not quotas:
            click.echo("no quotas")
        return
    parsed = {}
    for item in limits:
        name, sep, value = item.partition("=")
        try:
            parsed[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise click.UsageError(f"quota {item!r}: expected RESOURCE=NUMBER, e.g. GPU=16")
    if not parsed and not clear:
        raise click.UsageError("give RESOURCE=NUMBER limits, or --clear")
    got = ctl.set_quota(queue, **({} if clear else parsed))
    shown = ", ".join(f"{k}={v:g}" for k, v in sorted(got.items())) or "no quota"
    click.echo(f"{queue}: {shown}")


def _fail(message: str, code: int) -> None:
    if _DEBUG:
        import traceback

        traceback.print_exc()
    click.echo(f"placectl: error: {' '.join(str(message).split())}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``placectl`` console script."""
    global _DEBUG
    args = sys.argv[1:] if argv is None else list(argv)
    _DEBUG = "--debug" in args[:1]
    try:
        cli.main(args=args, prog_name="placectl", standalone_mode=False)
    except PlacementError as e:
        _fail(str(e), exit_codes.code_of(e))
    except click.UsageError as e:
        _fail(e.format_message(), exit_codes.USAGE)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code or exit_codes.UNCLASSIFIED)
    except (click.Abort, KeyboardInterrupt):
        _fail("aborted", exit_codes.INTERRUPTED)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as e:  # anything else still gets one line, not a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        _fail(f"{type(e).__name__}: {first}", 1)


if __name__ == "__main__":
    main()
