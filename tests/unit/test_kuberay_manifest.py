"""The shipped RayCluster (docs/operations/raycluster.yaml) against KubeRay's own CRD
schema, at the oldest release the docs name and the newest checked: no field the CRD
does not know (the API server would prune it silently), every type right, every required
field there. The schema facts come from the CRD files by scripts/tools/kuberay_schema.py.
And the converse: at KubeRay 1.4.2 the manifest's group labels are unknown fields."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = yaml.safe_load((ROOT / "docs" / "operations" / "raycluster.yaml").read_text())
OLDEST, NEWEST = "v1.5.0", "v1.7.0"


def schema(version: str) -> dict:
    path = ROOT / "tests" / "data" / "kuberay" / f"rayclusters-{version}.json"
    return json.loads(path.read_text())["schema"]


def problems(value: object, schema: dict, path: str = "") -> list[str]:
    """What a structural schema finds wrong with ``value`` (empty: nothing)."""
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an int or a string"]
    if "anyOf" in schema and "type" not in schema:
        if any(not problems(value, s, path) for s in schema["anyOf"]):
            return []
        return [f"{path}: matches none of its forms"]
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float)}
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: expected an integer"]
    elif kind in types and not isinstance(value, types[kind]):
        return [f"{path}: expected {kind}, found {type(value).__name__}"]
    found = []
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for name, sub in value.items():
            if props is not None and name in props:
                found += problems(sub, props[name], f"{path}.{name}")
            elif isinstance(extra, dict):
                found += problems(sub, extra, f"{path}.{name}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{name}: unknown field")
        found += [f"{path}.{r}: required" for r in schema.get("required", []) if r not in value]
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += problems(item, schema["items"], f"{path}[{i}]")
    return found


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_the_manifest_is_valid_for_kuberay(version):
    assert problems(MANIFEST, schema(version)) == []


def test_the_check_finds_what_an_older_kuberay_would_prune():
    found = problems(MANIFEST, schema("v1.4.2"))
    assert found == [
        ".spec.workerGroupSpecs[0].labels: unknown field",
        ".spec.workerGroupSpecs[1].labels: unknown field",
    ]
    bad = {**MANIFEST, "spec": {**MANIFEST["spec"], "rayVersion": 2.6, "headGroupSpecs": {}}}
    assert sorted(problems(bad, schema(NEWEST))) == [
        ".spec.headGroupSpecs: unknown field",
        ".spec.rayVersion: expected string, found float",
    ]


def test_the_manifest_says_which_kuberay_it_needs():
    first = (ROOT / "docs" / "operations" / "raycluster.yaml").read_text().splitlines()[0]
    assert f"KubeRay >= {OLDEST.lstrip('v')}" in first
