#!/usr/bin/env python3
"""Write the facts of KubeRay's RayCluster schema that the shipped manifest
(docs/operations/raycluster.yaml) meets: for every object the manifest fills, the field
names the CRD allows there, their types and which are required; no descriptions. The
result goes to tests/data/kuberay/rayclusters-<version>.json, which
tests/unit/test_kuberay_manifest.py checks the manifest against.

Usage: scripts/tools/kuberay_schema.py CRD_YAML VERSION
  CRD_YAML: ray-operator/config/crd/bases/ray.io_rayclusters.yaml of a KubeRay release
"""

from __future__ import annotations

import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "operations" / "raycluster.yaml"
KEEP = ("type", "required", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")


def prune(schema: dict, value: object) -> dict:
    """The part of ``schema`` that ``value`` meets: its kind, and below an object the
    allowed names (each field the value fills, pruned along it)."""
    out = {k: schema[k] for k in KEEP if k in schema}
    if "anyOf" in schema:
        out["anyOf"] = [{k: s[k] for k in KEEP if k in s} for s in schema["anyOf"]]
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        out["properties"] = {
            name: prune(sub, value[name]) if name in value else {}
            for name, sub in sorted(props.items())
        }
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        extra = schema["additionalProperties"]
        out["additionalProperties"] = prune(extra, next(iter(value.values()), None))
    if isinstance(value, list) and "items" in schema:
        merged: dict = {}
        for item in value:  # each item may fill other fields
            part = prune(schema["items"], item)
            for name, sub in part.get("properties", {}).items():
                if sub or name not in merged.setdefault("properties", {}):
                    merged.setdefault("properties", {})[name] = sub
            merged.update({k: v for k, v in part.items() if k != "properties"})
        out["items"] = merged
    return out


def main() -> int:
    crd_path, version = sys.argv[1], sys.argv[2]
    crd = yaml.safe_load(pathlib.Path(crd_path).read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    manifest = yaml.safe_load(MANIFEST.read_text())
    facts = {
        "origin": f"github.com/ray-project/kuberay {version}, "
        "ray-operator/config/crd/bases/ray.io_rayclusters.yaml (version v1), pruned to "
        "what docs/operations/raycluster.yaml fills by scripts/tools/kuberay_schema.py",
        "schema": prune(v1["schema"]["openAPIV3Schema"], manifest),
    }
    out = ROOT / "tests" / "data" / "kuberay" / f"rayclusters-{version}.json"
    out.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
