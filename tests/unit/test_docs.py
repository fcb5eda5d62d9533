"""What the documentation names exists: every error class, CLI command and option,
file, test and script the README and docs/ mention, and the version they give."""

from __future__ import annotations

import inspect
import pathlib
import re
import sys

import pytest
import tomllib

import clients
import controller
from controller import errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def text(path: pathlib.Path) -> str:
    return path.read_text()


def test_every_error_class_is_in_the_reference_and_exported_by_both_packages():
    page = text(ROOT / "docs" / "reference" / "errors.md")
    classes = [
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.PlacementError)
    ]
    assert [c for c in classes if f"`{c}`" not in page] == []
    for c in classes:
        assert getattr(controller, c) is getattr(clients, c), c


def test_the_cli_reference_is_what_the_cli_prints():
    sys.path.insert(0, str(ROOT / "scripts" / "tools"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "scripts" / "tools"))
    assert text(cli_reference.PAGE) == cli_reference.page(), "run scripts/tools/cli_reference.py"


def test_the_settings_reference_is_what_the_code_holds():
    sys.path.insert(0, str(ROOT / "scripts" / "tools"))
    try:
        import settings_reference
    finally:
        sys.path.remove(str(ROOT / "scripts" / "tools"))
    page = settings_reference.page()
    assert text(settings_reference.PAGE) == page, "run scripts/tools/settings_reference.py"
    assert "|  |" not in page  # every setting says why


def test_the_version_is_the_packages():
    project = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]
    from controller import SOURCE_VERSION

    assert project["version"] == SOURCE_VERSION
    assert f"Version {SOURCE_VERSION}" in text(ROOT / "README.md")


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(page):
    missing = []
    for target, _ in LINK.findall(text(page)):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert missing == []


# A path of the repository in backticks: `scripts/job/train.py`, `clients/testing/machines.py`.
PATH = re.compile(r"`((?:scripts|clients|controller|tests|docs)/[\w./-]+)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_a_page_names_exists(page):
    named = {m.rstrip("/.") for m in PATH.findall(text(page))}
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^\s*(?:\$ )?placectl ([a-z]+)((?: [^#\n]*)?)", re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_placectl_command_and_option_a_page_shows_exists(page):
    from clients.cli import cli

    bad = []
    for block in FENCE.findall(text(page)):
        for name, rest in COMMAND.findall(block):
            command = cli.commands.get(name)
            if command is None:
                bad.append(f"placectl {name}")
                continue
            known = {o for p in command.params for o in getattr(p, "opts", [])}
            known |= {o for p in cli.params for o in getattr(p, "opts", [])}
            for option in re.findall(r"(?<!\S)(--[a-z-]+)", rest):
                if option not in known:
                    bad.append(f"placectl {name} {option}")
    assert bad == []


def test_the_metrics_page_lists_every_metric_as_exported_with_its_labels():
    from controller.runtime.edge.metrics import METRICS, exported

    page = text(ROOT / "docs" / "operations" / "metrics.md")
    rows = {
        cells[1].strip("` "): cells
        for line in page.splitlines()
        if line.startswith("| `ray_") and (cells := line.split("|"))
    }
    assert set(rows) == {exported(name) for name in METRICS}
    for name, (kind, labels, _) in METRICS.items():
        row = rows[exported(name)]
        assert row[2].strip() == kind
        assert [label.strip("` ") for label in row[3].split(",") if label.strip()] == list(labels)
    named = set(re.findall(r"ray_placectl_[a-z_]+", "\n".join(text(p) for p in PAGES)))
    suffixes = ("_bucket", "_sum", "_count")
    known = {exported(n) + s for n in METRICS for s in ("", *suffixes)}
    assert named - known == set()


# Messages the troubleshooting page quotes that other programs print, not placectl.
_NOT_OURS = ("Waiting for creating a placement group", "ModuleNotFoundError")


def _code_strings() -> str:
    """Every string constant of controller/, clients/ and scripts/ (the constant parts
    of f-strings among them, implicit concatenations joined), one a line."""
    import ast

    out = []
    for base in ("controller", "clients", "scripts"):
        for path in sorted((ROOT / base).rglob("*.py")) + sorted((ROOT / base).rglob("*.sh")):
            if path.suffix == ".sh":
                out.append(path.read_text())
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append(node.value)
    return "\n".join(out)


def _example(word: str) -> bool:
    """Whether a word of a quoted message is an example value: a number, a name in
    quotes, an id, an elision, a variable's or a keyword's name."""
    bare = word.strip(",;:.")
    return (
        "\0" in word
        or any(c.isdigit() for c in word)
        or any(c in word for c in "'()_")
        or (len(bare) > 1 and bare.isupper())
    )


def _fragments(message: str) -> list[str]:
    """The runs of a quoted message that the code must hold as written: the words
    between the parts that are examples (:func:`_example`)."""
    words = message.replace("...", " \0 ").split()
    runs, run = [], []
    for w in words:
        if _example(w):
            runs.append(run)
            run = []
        else:
            run.append(w)
    runs.append(run)
    return [" ".join(r) for r in runs if len(r) >= 3]


def test_every_message_the_troubleshooting_page_quotes_is_one_the_code_prints():
    page = text(ROOT / "docs" / "reference" / "troubleshooting.md")
    quoted = re.findall(r"\*\*`([^`]+)`\*\*", page)
    assert len(quoted) >= 15, quoted  # the page still quotes its messages this way
    code = " ".join(_code_strings().split())
    missing = []
    for message in quoted:
        if message.startswith(_NOT_OURS):
            continue
        for fragment in _fragments(message):
            words = fragment.split()
            # A word beside an example may belong to it ("CPU 5", "placectl: ended").
            tries = [words, words[1:], words[:-1], words[1:-1]]
            if not any(len(t) >= 2 and " ".join(t) in code for t in tries):
                missing.append((message, fragment))
    assert missing == []


def test_every_benchmark_on_the_benchmarks_page_says_whether_ci_bounds_its_figures():
    page = text(ROOT / "docs" / "evidence" / "benchmarks.md")
    named = set(re.findall(r"scripts/bench/(bench_\w+\.py)", page))
    ledger = page.split("## Which figures CI bounds", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(bench_\w+\.py)` \|", ledger, re.M))
    assert named and named <= rows, sorted(named - rows)


def test_nothing_names_a_file_outside_the_repository():
    """Users get the repository, nothing beside it: no code, test or page may send them to
    the documents the project was conceived from."""
    outside = re.compile(r"PLACEMENT_SPEC\.md|DESIGN\.md|\.\./shared/")
    found = []
    for part in ("controller", "clients", "scripts", "tests", "docs"):
        for path in (ROOT / part).rglob("*"):
            if path.suffix not in (".py", ".md", ".yaml", ".yml", ".toml") or "_site" in str(path):
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if outside.search(line) and path != pathlib.Path(__file__).resolve():
                    found.append(f"{path.relative_to(ROOT)}:{n}")
    for name in ("README.md", "pyproject.toml", "mkdocs.yml"):
        if outside.search((ROOT / name).read_text()):
            found.append(name)
    assert found == []
