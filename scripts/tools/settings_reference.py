#!/usr/bin/env python3
"""Write docs/reference/settings.md from the code: every controller setting, the variable
that sets it, its default, and the reason written beside it in
controller/runtime/core/settings.py. tests/unit/test_docs.py fails when the page differs from
what this writes.

Usage: scripts/tools/settings_reference.py
"""

from __future__ import annotations

import pathlib
import re
import sys

import msgspec

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from controller.runtime.core import settings  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "settings.md"
HEAD = """# Controller settings

Generated from `controller/runtime/core/settings.py` by `scripts/tools/settings_reference.py`.
The controller reads each setting, when it starts, from its process's environment:
`PLACECTL_` and the setting's name in capitals. Two ways to give them:

- `placectl start --set suspect_after=3 --set drain_grace=120` (or
  `clients.connect(settings={"suspect_after": "3"})`) passes them to a controller that call
  starts; a controller already running keeps its own (`placectl stop`, then start again).
- In the head node's environment (on KubeRay, the head container's `env`), so that a
  controller Ray restarts on a new head has them too.

A value a setting does not take stops the controller's start with a `SettingsError` that
names the variable, what it takes and the default. The defaults suit a real cluster.

| setting | variable | default | why |
|---|---|---|---|
"""


def reasons() -> dict[str, str]:
    """Each field's comment in the source, joined into one line; fields written right
    after one another share the comment above them."""
    source = (ROOT / "controller" / "runtime" / "core" / "settings.py").read_text()
    body = source[source.index("class Settings") : source.index("\nFAST = ")]
    found, comment, after_field = {}, [], False
    for line in body.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if after_field:
                comment, after_field = [], False
            comment.append(stripped.lstrip("# "))
        elif m := re.match(r"(\w+): [\w| ]+ = ", stripped):
            found[m.group(1)] = " ".join(comment)
            after_field = True
        elif not stripped:
            comment, after_field = [], False
    return found


def page() -> str:
    why = reasons()
    rows = []
    for field in msgspec.structs.fields(settings.Settings):
        default = field.default
        shown = str(int(default)) if isinstance(default, bool) else f"{default:g}"
        text = why.get(field.name, "").replace("|", "\\|").replace("``", "`")
        rows.append(f"| `{field.name}` | `{settings.variable(field.name)}` | {shown} | {text} |")
    return HEAD + "\n".join(rows) + "\n"


if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
