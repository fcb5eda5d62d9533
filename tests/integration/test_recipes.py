"""The migration recipes (docs/guides/migration.md), run as written, and what they start
checked with Ray."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ray

from tests.integration.conftest import GPU_NODES, bundle_ids

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "migration.md"
BLOCK = re.compile(r"```python\n# recipe: ([\w-]+)\n(.*?)```", re.S)


def recipes() -> dict[str, str]:
    return dict(BLOCK.findall(PAGE.read_text()))


def run(name: str, conf: dict) -> dict:
    scope = {"conf": conf, "__name__": f"recipe_{name.replace('-', '_')}"}
    exec(compile(recipes()[name], f"docs/guides/migration.md recipe {name}", "exec"), scope)
    return scope


def truth(res, component: str) -> list[tuple[list[int], str]]:
    """Per rank, the devices Ray holds in its bundle and the bundle's node."""
    return [
        (bundle_ids(a.placement_group_id, a.bundle_index), a.placement.node_id)
        for a in res.assignments(component)
    ]


def test_the_readme_has_the_three_recipes():
    assert set(recipes()) == {"actor-options", "rlinf", "verl"}


def test_actor_options_recipe(ctl):
    conf = {"num_nodes": 1 + GPU_NODES, "component_placement": {"actor,rollout": "0-3"}}
    scope = run("actor-options", conf)
    res = scope["res"]
    expected = truth(res, "actor")  # shares of 1/2 leave room to ask Ray
    got = ray.get([a.where.remote() for a in scope["actors"]])
    assert [r for r, _, _ in got] == list(range(4))
    assert [(sorted(map(int, g)), n) for _, g, n in got] == expected


def test_rlinf_recipe(ctl):
    conf = {"num_nodes": 1 + GPU_NODES, "component_placement": {"actor": "0-7"}}
    res = ctl.reserve("rlinf-job", conf, 120)
    expected = truth(res, "actor")  # asked before the workers fill every bundle
    scope = run("rlinf", conf)
    got = scope["group"].execute("devices")
    assert [r for r, _ in got] == list(range(8))
    assert [[int(d) for d in cvd.split(",")] for _, cvd in got] == [d for d, _ in expected]
    scope["group"].shutdown()


def test_verl_recipe(ctl):
    pytest.importorskip("verl")
    conf = {"num_nodes": 1 + GPU_NODES, "component_placement": {"actor": "0-3"}}
    res = ctl.reserve("verl-job", conf, 120)
    expected = truth(res, "actor")
    scope = run("verl", conf)
    wg = scope["actor_wg"]
    got = wg.where()
    assert [r for r, _ in got] == list(range(4))
    assert [sorted(map(int, g)) for _, g in got] == [d for d, _ in expected]
    for w in wg.workers:
        ray.kill(w)
