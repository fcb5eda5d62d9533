"""``placectl`` commands about the controller and reservations: plan, start, stop, status,
reserve, apply, resize, repair, release."""

from __future__ import annotations

import click

from clients.cli.app import (
    address_option,
    cli,
    connect,
    emit,
    encode,
    fmt,
    force_option,
    output_option,
    warn_head,
    watch,
)
from controller import ClusterView, ComponentPlacement, NodeView, load_spec
from controller.errors import TableUnreadable
from controller.planning.cluster import load_cluster_view


def _dry_run_view(spec, nodes, gpus_per_node) -> ClusterView:
    """The cluster a dry run plans on: ``--nodes`` and ``--gpus-per-node`` when given,
    else the configuration's own, and what neither says from the running cluster."""
    gpus_per_node = spec.num_gpus_per_node if gpus_per_node is None else gpus_per_node
    if gpus_per_node is None:
        from clients.discovery import running_cluster_view

        view = running_cluster_view(spec.accelerator)
        if view is None:
            raise click.UsageError(
                "no Ray cluster is running to take the accelerators per node from; give "
                "--gpus-per-node N (or --cluster nodes.yaml for uneven nodes)"
            )
        return view if nodes is None else _resized(view, nodes)
    nodes = spec.num_nodes if nodes is None else nodes
    if nodes < 1 or gpus_per_node < 0:
        raise click.UsageError(
            f"--nodes {nodes} --gpus-per-node {gpus_per_node}: need nodes >= 1, gpus >= 0"
        )
    return ClusterView.uniform(num_nodes=nodes, gpus_per_node=gpus_per_node)


def _warn_idle_head(cp: ComponentPlacement, view: ClusterView) -> None:
    """Say when the plan counts a head without accelerators that none of its processes
    uses: a user who copied a framework's count of GPU nodes is one node short."""
    heads = [r for r, n in enumerate(view.nodes) if n.is_head and n.num_gpus == 0]
    used = {p.node_rank for c in cp.components for p in cp.placements(c)}
    for rank in heads:
        if rank not in used:
            click.echo(
                f"note: node rank {rank} is the Ray head, which has no accelerators and gets "
                f"no process here; num_nodes counts it ({len(view.nodes)} nodes, "
                f"{len(view.nodes) - 1} of them others)",
                err=True,
            )


def _resized(running: ClusterView, nodes: int) -> ClusterView:
    """``--nodes N`` on the running cluster's shape: its first N nodes, or all of them
    and more shaped like its last one; says which on stderr."""
    have = len(running.nodes)
    if nodes < 1:
        raise click.UsageError(f"--nodes {nodes}: need nodes >= 1")
    if nodes <= have:
        kept = running.nodes[:nodes]
        if nodes < have:
            click.echo(
                f"planning on the first {nodes} of the running cluster's {have} nodes", err=True
            )
        return ClusterView(nodes=list(kept))
    last = running.nodes[-1]
    more = [NodeView(num_gpus=last.num_gpus, resources=dict(last.resources))] * (nodes - have)
    click.echo(
        f"planning on the running cluster's {have} node(s) and {nodes - have} more shaped "
        f"like its last ({last.num_gpus} accelerator(s)): the running cluster could not "
        "hold this plan as it is",
        err=True,
    )
    return ClusterView(nodes=[*running.nodes, *more])


@cli.command()
@click.argument("config")
@click.option(
    "--nodes",
    type=int,
    help="Number of nodes, the head included (default: cluster.num_nodes, or the running "
    "cluster's).",
)
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
@output_option
def plan(config, nodes, gpus_per_node, cluster_file, output, as_json) -> None:
    """Dry run: show where every process of CONFIG would go. Needs no cluster."""
    spec = load_spec(config)
    if cluster_file:
        if nodes is not None or gpus_per_node is not None:
            raise click.UsageError("give either --cluster or --nodes/--gpus-per-node, not both")
        view = load_cluster_view(cluster_file)
    else:
        view = _dry_run_view(spec, nodes, gpus_per_node)
    cp = ComponentPlacement(spec, view)
    _warn_idle_head(cp, view)

    def table() -> str:
        from clients.render import render_plan

        return render_plan(cp)

    emit(fmt(output, as_json), cp.to_dict(), table)


@cli.command()
@address_option
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="NAME=VALUE",
    help="A controller setting for a controller this starts (repeatable); see the settings "
    "reference. The same as its PLACECTL_NAME variable in the head's environment.",
)
@output_option
def start(address, settings, output, as_json) -> None:
    """Start the controller on the cluster's head node (get-or-create; safe to repeat)."""
    given = {}
    for item in settings:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--set")
        given[name.strip()] = value.strip()
    ctl = connect(address, start=True, settings=given)
    health = ctl.health()
    count = health.get("reservations", 0)
    data = {"controller": ctl.name, "namespace": ctl.namespace, **health}
    emit(
        fmt(output, as_json),
        data,
        lambda: f"placectl controller {ctl.name!r} is running ({count} reservation(s))",
    )
    warn_head(health)


@cli.command()
@address_option
@click.option("--release-all", is_flag=True, help="Release every reservation first.")
@force_option
@output_option
def stop(address, release_all, force, output, as_json) -> None:
    """Stop the controller. Reservations stay (a new controller picks them up) unless
    --release-all (which needs --force: other clients' reservations go too)."""
    if release_all and not force:
        raise click.UsageError("--release-all releases other clients' reservations: add --force")
    ctl = connect(address)
    released = ctl.release_all(force=True) if release_all else []
    ctl.stop()
    lines = [f"released {len(released)} reservation(s)"] if release_all else []
    lines.append("placectl controller stopped")
    emit(
        fmt(output, as_json),
        {"stopped": ctl.name, "released": released},
        lambda: "\n".join(lines),
    )


def _status(ctl, job):
    """(data, table) of ``placectl status [JOB]``."""
    from clients.render import render_reservation, render_reservations

    if job is None:
        infos = ctl.list()
        return infos, lambda: render_reservations(infos)
    res = ctl.reservation(job)
    assignments = (
        {name: res.assignments(name, allow_degraded=True) for name in res.components}
        if res.info.state in ("ready", "degraded")
        else {}
    )
    standbys = {}
    if res.info.state in ("ready", "degraded") and res.info.spares:
        from clients.standby import standby_states

        standbys = {
            name: [state for _, state in rows] for name, rows in standby_states(res).items()
        }
    short = {}
    if res.info.state in ("ready", "degraded"):
        from clients.short import short_states

        short = short_states(res)  # groups of on_loss: continue running short now
    data = {"reservation": res.info, "assignments": assignments, "standbys": standbys}
    if short:
        data["short"] = short
    return data, lambda: render_reservation(res.info, assignments, standbys, short)


@cli.command()
@click.argument("job", required=False)
@address_option
@output_option
@click.option(
    "--watch", "watch_", is_flag=True, help="Redraw whenever the state changes (Ctrl-C ends)."
)
@click.option("--interval", type=float, default=1.0, show_default=True, help="With --watch.")
def status(job, address, output, as_json, watch_, interval) -> None:
    """List reservations, or show JOB's map with real IPs and physical accelerator ids.
    The list also names, on stderr, placement groups that wait outside every
    reservation."""
    output = fmt(output, as_json)
    ctl = connect(address)
    health = ctl.health()
    if health.get("refusal"):
        raise TableUnreadable(
            f"the controller refuses to act: the reservation table cannot be read: "
            f"{health['refusal']}"
        )
    warn_head(health)
    if job is None:
        warn_outside(ctl)

    def show() -> str:
        data, table = _status(ctl, job)
        if output != "table":
            return encode(data, output)
        head = "" if job else f"controller {ctl.name}: placectl {health.get('version', '?')}\n"
        return head + table()

    if watch_:
        watch(show, interval, output)
    else:
        click.echo(show())


def warn_outside(ctl) -> None:
    """Name, on stderr, each placement group that waits outside every reservation (an
    engine or a job that asked Ray for accelerators the reservations hold)."""
    from clients import outside

    try:
        groups, held = outside.read(ctl)
    except Exception as e:  # the list above it is still worth showing
        click.echo(f"warning: could not read Ray's placement groups: {e}", err=True)
        return
    for group in groups:
        click.echo(f"warning: {outside.describe(group, held)}", err=True)


def _one_line(info) -> str:
    from clients.render import node_count

    return (
        f"{info.job}: {info.state}, epoch {info.epoch}, {node_count(info)} node(s), "
        f"{info.num_accelerators} {info.accelerator}, components "
        + ", ".join(f"{n} x{w}" for n, w in info.components.items())
        + (f" ({info.reason})" if info.reason else "")
    )


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
@output_option
def reserve(
    job,
    config,
    address,
    timeout_s,
    replace,
    repair,
    queue,
    priority,
    preemptible,
    force,
    output,
    as_json,
) -> None:
    """Reserve CONFIG's resources for JOB (idempotent). Waits, with progress, until the
    cluster can place it or the timeout passes; Ctrl-C cancels it (and leaves the queue)."""
    spec = load_spec(config)
    ctl = connect(address, start=True)
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
    emit(fmt(output, as_json), res.info, lambda: _one_line(res.info))


@cli.command()
@click.argument("job")
@click.argument("config")
@address_option
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--plan", "dry_run", is_flag=True, help="Only show what would change.")
@force_option
@output_option
def apply(job, config, address, timeout_s, dry_run, force, output, as_json) -> None:
    """Give the live reservation JOB the configuration CONFIG, touching only what
    changes: unchanged slots and ranks stay, the rest is made or removed. All or
    nothing. --plan shows, per component, the ranks that stay, move, start and stop."""
    from clients.render import render_apply

    spec = load_spec(config)
    summary = connect(address).apply(job, spec, timeout_s=timeout_s, dry_run=dry_run, force=force)
    emit(fmt(output, as_json), summary, lambda: render_apply(summary))


@cli.command()
@click.argument("job")
@click.argument("component")
@click.argument("placement", required=False)
@click.option("--node-group", "node_group", multiple=True, help="Move to these node groups.")
@address_option
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--plan", "dry_run", is_flag=True, help="Only show what would change.")
@force_option
@output_option
def resize(
    job, component, placement, node_group, address, timeout_s, dry_run, force, output, as_json
) -> None:
    """Place COMPONENT of JOB anew: a new PLACEMENT string (rollout 0-7 -> 0-15),
    --node-group to move it, or both; an apply of one component."""
    from clients.render import render_apply

    groups = list(node_group) or None
    summary = connect(address).resize(
        job, component, placement, groups, timeout_s=timeout_s, dry_run=dry_run, force=force
    )
    emit(fmt(output, as_json), summary, lambda: render_apply(summary))


@cli.command()
@click.argument("job")
@address_option
@force_option
@output_option
def repair(job, address, force, output, as_json) -> None:
    """Replace JOB's lost node slots now (reservations made with --repair manual wait
    for this)."""
    info = connect(address).repair(job, force=force)
    emit(fmt(output, as_json), info, lambda: _one_line(info))


@cli.command()
@click.argument("job", required=False)
@address_option
@click.option("--all", "all_", is_flag=True, help="Release every reservation (needs --force).")
@force_option
@output_option
def release(job, address, all_, force, output, as_json) -> None:
    """Release JOB's reservation (idempotent), or every one with --all --force. Another
    client's reservation needs --force."""
    if bool(job) == all_:
        raise click.UsageError("give either JOB or --all")
    if all_ and not force:
        raise click.UsageError("--all releases other clients' reservations too: add --force")
    ctl = connect(address)
    if all_:
        done = ctl.release_all(force=True)
        text = f"released {len(done)} reservation(s)" + (f": {', '.join(done)}" if done else "")
    else:
        done = [job] if ctl.release(job, force=force) else []
        text = f"released {job}" if done else f"{job}: no such reservation"
    emit(fmt(output, as_json), {"released": done}, lambda: text)
