"""The ``placectl`` command line.

Every failure prints one line, ``placectl: error: ...``, naming the input at fault, and
exits non-zero (2 for bad input); no traceback reaches the user.
"""

from __future__ import annotations

import json
import sys

import click

from controller import ClusterView, ComponentPlacement, PlacementError, load_spec
from controller.cluster import load_cluster_view


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """placectl: placement controller for RL post-training on Ray."""


@cli.command()
@click.argument("config")
@click.option("--nodes", type=int, help="Number of nodes (default: cluster.num_nodes).")
@click.option(
    "--gpus-per-node",
    type=int,
    help="Accelerators per node (default: cluster.num_gpus_per_node).",
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
        nodes = spec.num_nodes if nodes is None else nodes
        gpus_per_node = spec.num_gpus_per_node if gpus_per_node is None else gpus_per_node
        if gpus_per_node is None:
            raise click.UsageError("--gpus-per-node is required (or set cluster.num_gpus_per_node)")
        if nodes < 1 or gpus_per_node < 0:
            raise click.UsageError(
                f"--nodes {nodes} --gpus-per-node {gpus_per_node}: need nodes >= 1, gpus >= 0"
            )
        view = ClusterView.uniform(num_nodes=nodes, gpus_per_node=gpus_per_node)
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


def _connect(address: str, start: bool = False):
    import clients

    try:
        return clients.connect(address=address, start=start)
    except ConnectionError as e:
        raise click.ClickException(
            f"cannot reach a Ray cluster at {address!r} ({e}); start one with `ray start --head`"
        ) from None


@cli.command()
@address_option
def start(address) -> None:
    """Start the controller on the cluster (get-or-create; safe to repeat)."""
    ctl = _connect(address, start=True)
    click.echo(f"placectl controller {ctl.name!r} is running ({len(ctl.list())} reservation(s))")


@cli.command()
@address_option
@click.option("--release-all", is_flag=True, help="Release every reservation first.")
def stop(address, release_all) -> None:
    """Stop the controller. Reservations stay (a new controller picks them up) unless
    --release-all."""
    ctl = _connect(address)
    if release_all:
        released = ctl.release_all()
        click.echo(f"released {len(released)} reservation(s)")
    ctl.stop()
    click.echo("placectl controller stopped")


@cli.command()
@click.argument("job", required=False)
@address_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(job, address, as_json) -> None:
    """List reservations, or show JOB's map with real IPs and physical accelerator ids."""
    import msgspec

    from clients.render import render_reservation, render_reservations

    ctl = _connect(address)
    if job is None:
        infos = ctl.list()
        click.echo(msgspec.json.encode(infos).decode() if as_json else render_reservations(infos))
        return
    res = ctl.reservation(job)
    assignments = (
        {name: res.assignments(name) for name in res.components}
        if res.info.state in ("ready", "degraded")
        else {}
    )
    if as_json:
        data = {"reservation": res.info, "assignments": assignments}
        click.echo(msgspec.json.encode(data).decode())
    else:
        click.echo(render_reservation(res.info, assignments))


@cli.command()
@click.argument("job")
@click.argument("config")
@address_option
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--replace", is_flag=True, help="Replace a reservation with another spec.")
def reserve(job, config, address, timeout_s, replace) -> None:
    """Reserve CONFIG's resources for JOB (idempotent). Waits, with progress, until the
    cluster can place it or the timeout passes."""
    spec = load_spec(config)
    ctl = _connect(address, start=True)
    res = ctl.reserve(job, spec, timeout_s=timeout_s, replace=replace)
    info = res.info
    click.echo(
        f"{job}: {info.state}, {len(info.slots)} node slot(s), {info.num_accelerators} "
        f"{info.accelerator}, components "
        + ", ".join(f"{n} x{w}" for n, w in info.components.items())
    )


@cli.command()
@click.argument("job", required=False)
@address_option
@click.option("--all", "all_", is_flag=True, help="Release every reservation.")
def release(job, address, all_) -> None:
    """Release JOB's reservation (idempotent), or every one with --all."""
    if bool(job) == all_:
        raise click.UsageError("give either JOB or --all")
    ctl = _connect(address)
    if all_:
        done = ctl.release_all()
        click.echo(
            f"released {len(done)} reservation(s)" + (f": {', '.join(done)}" if done else "")
        )
    else:
        click.echo(f"released {job}" if ctl.release(job) else f"{job}: no such reservation")


def _fail(message: str, code: int) -> None:
    click.echo(f"placectl: error: {' '.join(str(message).split())}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``placectl`` console script."""
    try:
        cli.main(args=argv, prog_name="placectl", standalone_mode=False)
    except PlacementError as e:
        _fail(str(e), 2)
    except click.UsageError as e:
        _fail(e.format_message(), 2)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code or 1)
    except click.Abort:
        _fail("aborted", 130)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as e:  # anything else still gets one line, not a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        _fail(f"{type(e).__name__}: {first}", 1)


if __name__ == "__main__":
    main()
