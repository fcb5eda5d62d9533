"""The layers and rooms of the code, read from its source:

* dependencies point one way: ``planning`` <- ``state`` <- ``runtime`` <- ``clients``
  (which reach the runtime through ``controller.surface`` alone), and inside
  ``controller`` Ray is imported only by the runtime's edge and by the records'
  scheduling options (``RAY_HOMES``);
* no object reads or writes another object's private attributes (an attribute whose
  name starts with ``_`` is touched only through ``self``/``cls``), so each class of
  ``controller/runtime`` keeps its own state and the others go through its methods;
* the table is changed only by the state owner: only ``state.py`` holds the Store, and
  only ``store.py`` writes the GCS key-value store.
"""

from __future__ import annotations

import ast
import asyncio
import pathlib
import warnings

import pytest

from clients.testing.fake_cluster import FakeCluster
from controller.runtime.core.state import ReservationState
from controller.runtime.core.store import Store

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "controller" / "runtime"
# Attributes of other libraries' objects that have no public spelling.
FOREIGN = {"_actor_id"}  # ray.actor.ActorHandle's id


def sources(*parts: str) -> list[pathlib.Path]:
    return sorted(p for part in parts for p in (ROOT / part).rglob("*.py"))


# Where the controller imports Ray: the runtime's edge (the controller's cluster I/O)
# and state/scheduling.py (a record's bundle as Ray's scheduling strategy, which drivers
# start their processes with; it imports Ray only when called, so records read without
# Ray). Nowhere else.
RAY_HOMES = ("controller/runtime/edge/", "controller/state/scheduling.py")


def module_level_imports(path: pathlib.Path) -> set[str]:
    """What ``path`` imports when it is imported (not inside a function)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def imported_names(tree: ast.AST) -> set[str]:
    """Names bound by import statements anywhere in the module (modules and the
    objects of other libraries, whose private parts are theirs to name)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
    return names


def private_reaches(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    allowed = imported_names(tree) | {"self", "cls"}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") or node.attr in FOREIGN:
            continue
        base = node.value
        while isinstance(base, ast.Attribute):
            base = base.value  # ray._private.worker: judged by its root name
        if isinstance(base, ast.Name) and base.id in allowed:
            continue
        if isinstance(base, ast.Call) and ast.unparse(base.func) == "super":
            continue  # a subclass calling its framework base class's hook
        out.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_dependencies_point_one_way():
    """The layers of ``controller/``, each a folder: planning < state < runtime, and
    inside the runtime edge (Ray and the network) < core (the records' owner, the nodes,
    the clock) < steps (what the controller does) < the calls at the top. ``clients``
    use the runtime only through ``controller.surface``; their test harness
    (``clients.testing``), which fakes the runtime's cluster I/O, is the exception by
    what it is. Ray is imported only where RAY_HOMES says."""
    calls = (
        "controller.runtime.controller",
        "controller.runtime.reads",
        "controller.runtime.changes",
    )
    rules = {
        "controller/planning": ("controller.state", "controller.runtime", "clients"),
        "controller/state": ("controller.runtime", "clients"),
        "controller/runtime": ("clients",),
        "controller/runtime/edge": ("controller.runtime.core", "controller.runtime.steps", *calls),
        "controller/runtime/core": ("controller.runtime.steps", *calls),
        "controller/runtime/steps": calls,
        # What a user may import, and the scripts, never reach into the test suite.
        "controller": ("tests",),
        "clients": ("tests",),
        "scripts": ("tests",),
    }
    bad = []
    for folder, banned in rules.items():
        for path in sources(folder):
            for name in imports(path):
                if any(name == b or name.startswith(b + ".") for b in banned):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    for path in sources("clients"):
        if "testing" in path.relative_to(ROOT).parts:
            continue
        for name in imports(path):
            if name.startswith("controller.runtime"):
                bad.append(f"{path.relative_to(ROOT)} imports {name}, not controller.surface")
    for path in sources("controller"):
        where = str(path.relative_to(ROOT))
        if any(n.split(".")[0] == "ray" for n in imports(path)) and not where.startswith(RAY_HOMES):
            bad.append(f"{where} imports Ray outside {', '.join(RAY_HOMES)}")
    lazy = ROOT / RAY_HOMES[1]
    if any(n.split(".")[0] == "ray" for n in module_level_imports(lazy)):
        bad.append(f"{RAY_HOMES[1]} imports Ray when imported: records would need Ray")
    assert bad == []


def test_no_object_reaches_into_another_objects_private_attributes():
    # The conformance scripts drive the frameworks' own private helpers: theirs to name.
    ours = [p for p in sources("controller", "clients", "scripts") if "conformance" not in p.parts]
    bad = [line for path in ours for line in private_reaches(path)]
    assert bad == []


def test_the_check_catches_a_reach_into_another_object(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "import ray\n\ndef f(repairer):\n    ray._private\n    return repairer._tasks\n"
    )
    assert private_reaches(sneaky, tmp_path) == ["sneaky.py:5: repairer._tasks"]


def test_only_the_state_owner_holds_the_store_and_only_the_store_writes_the_table():
    bad = []
    for path in sources("controller/runtime"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if path.name not in ("state.py", "store.py", "controller.py") and (
                isinstance(node, ast.Name) and node.id == "Store"
            ):
                bad.append(f"{path.name}:{node.lineno} names the Store")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("kv_put", "kv_delete")
                and path.name not in ("store.py", "ray_io.py")
            ):
                bad.append(f"{path.name}:{node.lineno} writes the key-value store")
        if path.name == "controller.py":  # it only builds the state owner with it
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
            made = [n for n in calls if ast.unparse(n.func) == "Store"]
            owners = [n for n in calls if ast.unparse(n.func) == "ReservationState"]
            assert len(made) == 1 and owners and owners[0].args[0] is made[0]
    assert bad == []


def test_the_state_hands_out_records_that_cannot_be_changed():
    async def go():
        state = ReservationState(Store(FakeCluster()), FakeCluster().metrics)
        with pytest.raises(TypeError):
            state.records["j"] = None  # type: ignore[index]

    asyncio.run(go())


# One concept per module: past SAY_LINES a module is said to be looked at (a warning);
# past MOST_LINES it fails. The line count is a smell, not the rule: a concept is not
# split to meet it (the fault path's restructuring folds such splits back).
SAY_LINES, MOST_LINES = 400, 600


def test_modules_stay_small():
    """placectl's own code, its scripts and its tests (not the frameworks' stand-ins the
    tests put on a path)."""
    ours = [
        p for p in sources("controller", "clients", "scripts", "tests") if "_site" not in str(p)
    ]
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in ours}
    big = {n: s for n, s in sizes.items() if s > SAY_LINES}
    if big:
        warnings.warn(f"modules past {SAY_LINES} lines (one concept each?): {big}", stacklevel=1)
    assert {n: s for n, s in big.items() if s > MOST_LINES} == {}


# The clock itself; code that runs in a node's own process, where no loop is the clock;
# and the history's timestamps, a label for people that no deadline reads.
REAL_CLOCK = {
    "controller/runtime/core/__init__.py",
    "controller/runtime/edge/node_tasks.py",
    "controller/state/events.py",
}


def test_the_controller_reads_time_only_through_its_loop():
    """Every deadline of the controller reads ``tasks.now()`` or ``tasks.wall()`` (its
    event loop's clock), so a test's virtual-time loop is its whole clock: one
    ``time.monotonic()`` left would be a deadline that never passes in such a test."""
    reads = []
    for path in sources("controller"):
        rel = str(path.relative_to(ROOT))
        if rel in REAL_CLOCK or rel.startswith("controller/planning/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "time"
                and node.func.attr in ("time", "monotonic")
            ):
                reads.append(f"{rel}:{node.lineno}")
    assert reads == []


# The one abstract method: each placement strategy says how it assigns ranks.
ABSTRACT = {("controller/planning/strategies/base.py", "assign")}


def test_no_class_stubs_what_another_provides():
    """No mixins: a class uses what it was given or inherited from a real base, never a
    method stubbed to be filled in by whatever class it is mixed into."""
    stubs = set()
    for path in sources("controller", "clients"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = [n for n in node.body if not isinstance(n, ast.Expr)]  # docstring
                if (
                    len(body) == 1
                    and isinstance(body[0], ast.Raise)
                    and "NotImplementedError" in ast.unparse(body[0])
                ):
                    stubs.add((str(path.relative_to(ROOT)), node.name))
    assert stubs == ABSTRACT


def test_every_change_of_a_record_is_named_in_one_module():
    """Only the :class:`Transitions` (in ``core/transitions.py``) commit or forget a record:
    the operations say when a record changes, they what the change is."""
    callers = set()
    for path in sources("controller", "clients"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("commit", "forget")
            ):
                callers.add(str(path.relative_to(ROOT)))
    assert callers == {"controller/runtime/core/transitions.py"}


def test_the_drivers_reach_into_rays_private_state_in_one_module():
    """``clients`` reads Ray's GCS client and actor table through ``clients/ray_state.py``
    alone (the test harness aside): a Ray that moves them is followed in one place."""
    home = ROOT / "clients" / "ray_state.py"
    bad = []
    for path in sources("clients"):
        if path == home or "testing" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            dotted = isinstance(node, ast.Attribute) and node.attr == "_private"
            imported = isinstance(node, ast.ImportFrom) and "._private" in (node.module or "")
            if dotted or imported:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []
