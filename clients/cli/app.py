"""The ``placectl`` command group and what every command shares: which controller it
talks to (``--address``, ``--name``, ``--namespace``), how it prints a result (``-o
table|json|yaml``), how ``--watch`` redraws, and how an error becomes one line and an exit
code (:mod:`clients.exit_codes`)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import msgspec

from clients import exit_codes
from controller import PlacementError, version
from controller.errors import ClusterUnavailable

_DEBUG = False
FORMATS = ("table", "json", "yaml")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version(), "--version", prog_name="placectl", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show the traceback behind an error.")
@click.option(
    "--name",
    default="placectl",
    show_default=True,
    envvar="PLACECTL_NAME",
    help="The controller actor's name (env PLACECTL_NAME).",
)
@click.option(
    "--namespace",
    default="placectl",
    show_default=True,
    envvar="PLACECTL_NAMESPACE",
    help="The controller actor's Ray namespace (env PLACECTL_NAMESPACE).",
)
def cli(debug: bool, name: str, namespace: str) -> None:
    """placectl: placement controller for RL post-training on Ray."""
    global _DEBUG
    _DEBUG = debug


address_option = click.option(
    "--address",
    default="auto",
    show_default=True,
    help="Ray cluster address (default: the running cluster, as `ray status` finds it).",
)

force_option = click.option(
    "--force", is_flag=True, help="Act on another client's reservation (logged by the controller)."
)


def output_option(f: Callable) -> Callable:
    """``-o/--output table|json|yaml`` (and ``--json``, kept as ``-o json``)."""
    f = click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")(f)
    return click.option(
        "-o",
        "--output",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="How to print the result: a table for people, json or yaml for programs.",
    )(f)


def fmt(output: str, as_json: bool) -> str:
    return "json" if as_json else output


def encode(data: Any, output: str) -> str:
    """``data`` (structs, dicts, lists) as ``output`` (json or yaml) text."""
    plain = msgspec.to_builtins(data)
    if output == "yaml":
        import yaml

        return yaml.safe_dump(plain, sort_keys=False).rstrip()
    return json.dumps(plain)


def emit(output: str, data: Any, table: Callable[[], str]) -> None:
    """Print a command's result: ``table()`` for people, else ``data`` encoded."""
    click.echo(table() if output == "table" else encode(data, output))


def watch(show: Callable[[], str], interval: float, output: str) -> None:
    """Print ``show()`` whenever it changes, until Ctrl-C (which ends it without an
    error). A table on a terminal is redrawn, as ``watch`` and ``kubectl get -w`` do;
    piped, each change is appended: a table after a time line, yaml as one more
    document, json one document per line."""
    redraw = output == "table" and sys.stdout.isatty()
    last = None
    try:
        while True:
            text = show()
            if text != last:
                now = time.strftime("%H:%M:%S")
                if redraw:
                    click.clear()
                    click.echo(f"every {interval:g}s, {now} (Ctrl-C ends)\n")
                elif last is not None and output != "json":
                    click.echo("---" if output == "yaml" else f"--- {now}")
                click.echo(text)
                last = text
            time.sleep(interval)
    except KeyboardInterrupt:  # the way a watch ends: not an error
        return


def connect(address: str, start: bool = False, settings: dict[str, str] | None = None):
    """The controller the command line names (``--name``, ``--namespace``)."""
    import ray

    import clients
    from controller.surface import settings_by_name as by_name

    by_name(settings or {})  # a bad --set fails before any cluster is reached
    root = click.get_current_context().find_root().params
    try:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        return clients.connect(
            address=address,
            start=start,
            name=root["name"],
            namespace=root["namespace"],
            settings=settings,
        )
    except ConnectionError as e:
        raise ClusterUnavailable(
            f"cannot reach a Ray cluster at {address!r} ({e}); start one with `ray start --head`"
        ) from None


def warn_head(health: dict) -> None:
    """Say, before it happens, what a head loss would cost on this cluster; and that
    the controller suspects itself, when it does."""
    cut = health.get("cut_off")
    if cut:
        click.echo(
            f"warning: the controller reaches {cut.get('reached')} of {cut.get('asked')} "
            "node(s) it asks (the head's own network?): it fences no silent node until it "
            "reaches a majority again; Ray's health checks decide meanwhile.",
            err=True,
        )
    if health.get("gcs_store") == "memory":
        click.echo(
            "warning: Ray's GCS keeps this cluster's tables in memory (no GCS fault "
            "tolerance): if the head node is lost, every reservation, placement group and "
            "worker is lost with it. Start the head with RAY_REDIS_ADDRESS=<redis host:port> "
            "to keep them across a head restart.",
            err=True,
        )


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
