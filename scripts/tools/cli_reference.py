#!/usr/bin/env python3
"""Write docs/reference/cli.md from the command line itself: every command's help, as
`placectl COMMAND --help` prints it. tests/unit/test_docs.py fails when the page differs
from what this writes, so the reference cannot drift from the CLI.

Usage: scripts/tools/cli_reference.py [--check]
"""

from __future__ import annotations

import pathlib
import sys

import click

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from clients import exit_codes
from clients.cli import cli

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
HEAD = """# Command line

Generated from the CLI by `scripts/tools/cli_reference.py`: every command's `--help`, and the
exit codes. An error is one line on stderr (`--debug` shows the traceback behind it)
and one of these exit codes, so a script can tell what to retry from what to fix:

"""


def help_of(command: click.Command, path: list[str]) -> str:
    ctx = click.Context(  # as `placectl ... --help` makes it: the CLI's own settings
        command,
        info_name=" ".join(path),
        terminal_width=88,
        max_content_width=88,
        **cli.context_settings,
    )
    return command.get_help(ctx)


def exit_code_table() -> str:
    """The table of clients.exit_codes's docstring, as Markdown."""
    rows: list[list[str]] = []
    for line in exit_codes.__doc__.splitlines():
        head, _, rest = line.partition(" ")
        if head.isdigit():
            rows.append([head, rest])
        elif rows and line.startswith("      ") and line.strip():
            rows[-1][1] += " " + line.strip()
    table = ["| code | meaning |", "|---|---|"]
    table += [f"| {code} | {' '.join(meaning.split())} |" for code, meaning in rows]
    return "\n".join(table) + "\n"


def page() -> str:
    out = [
        HEAD,
        exit_code_table(),
        "\n## placectl\n\n```\n" + help_of(cli, ["placectl"]) + "\n```\n",
    ]
    for name in sorted(cli.commands):
        command = cli.commands[name]
        text = help_of(command, ["placectl", name])
        out.append(f"\n## placectl {name}\n\n```\n{text}\n```\n")
    return "".join(out)


def main() -> int:
    text = page()
    if "--check" in sys.argv:
        if PAGE.read_text() != text:
            print(f"{PAGE} is stale: run scripts/tools/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
