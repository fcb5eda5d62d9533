"""The shipped RayCluster (docs/operations/raycluster.yaml) against KubeRay's own CRD
schema, whole, at the oldest release the docs name and the newest: no field the CRD does
not know at any depth (the API server would prune it silently), every type right, every
required field there, every value within the rules the API server checks (enum, pattern,
length, minimum). The schema facts come from the CRD files, descriptions left out, by
scripts/tools/kuberay_schema.py. And the converse: at KubeRay 1.4.2 the manifest's group
labels are unknown fields."""

from __future__ import annotations

import copy
import gzip
import json
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = yaml.safe_load((ROOT / "docs" / "operations" / "raycluster.yaml").read_text())
OLDEST, NEWEST = "v1.5.0", "v1.7.0"


def schema(version: str) -> dict:
    path = ROOT / "tests" / "data" / "kuberay" / f"rayclusters-{version}.json.gz"
    return json.loads(gzip.decompress(path.read_bytes()))["schema"]


def problems(value: object, schema: dict, path: str = "") -> list[str]:
    """What a structural schema finds wrong with ``value`` (empty: nothing)."""
    if value is None and schema.get("nullable"):
        return []
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
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        found.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        found.append(f"{path}: longer than {schema['maxLength']}")
    if isinstance(value, (int, float)) and value < schema.get("minimum", value):
        found.append(f"{path}: below {schema['minimum']}")
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


def test_the_schema_is_whole_and_the_check_reaches_every_depth():
    """A field added anywhere, however deep, is checked: the schema was not cut down to
    what the manifest held when it was written."""
    full = schema(NEWEST)
    pod = full["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]["template"]
    # fields the manifest does not fill are there too
    assert {"affinity", "tolerations", "volumes"} <= set(pod["properties"]["spec"]["properties"])
    bad = copy.deepcopy(MANIFEST)
    container = bad["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["securityContext"] = {"capabilities": {"add": "SYS_PTRACE", "adds": ["x"]}}
    container["ports"] = [{"containerPort": "8265"}]
    bad["spec"]["autoscalerOptions"]["upscalingMode"] = "Fast"
    head = ".spec.workerGroupSpecs[0].template.spec.containers[0]"
    assert sorted(problems(bad, full)) == [
        ".spec.autoscalerOptions.upscalingMode: 'Fast' is not one of "
        "['Default', 'Aggressive', 'Conservative']",
        f"{head}.ports[0].containerPort: expected an integer",
        f"{head}.securityContext.capabilities.add: expected array, found str",
        f"{head}.securityContext.capabilities.adds: unknown field",
    ]


def test_the_manifest_says_which_kuberay_it_needs():
    first = (ROOT / "docs" / "operations" / "raycluster.yaml").read_text().splitlines()[0]
    assert f"KubeRay >= {OLDEST.lstrip('v')}" in first


def test_the_rocksdb_store_is_an_option_of_kuberay_1_7_and_unknown_before():
    """docs/operations/gcs-rocksdb.yaml in place of the manifest's Redis options: valid
    for KubeRay 1.7.0, whose CRD added the embedded store; 1.5.0 knows no such option
    (and wants a Redis address)."""
    rocks = yaml.safe_load((ROOT / "docs" / "operations" / "gcs-rocksdb.yaml").read_text())
    manifest = copy.deepcopy(MANIFEST)
    manifest["spec"]["gcsFaultToleranceOptions"] = rocks["gcsFaultToleranceOptions"]
    assert problems(manifest, schema(NEWEST)) == []
    assert sorted(problems(manifest, schema(OLDEST))) == [
        ".spec.gcsFaultToleranceOptions.backend: unknown field",
        ".spec.gcsFaultToleranceOptions.redisAddress: required",
        ".spec.gcsFaultToleranceOptions.storage: unknown field",
    ]
