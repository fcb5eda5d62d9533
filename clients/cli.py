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


if __name__ == "__main__":
    main()
