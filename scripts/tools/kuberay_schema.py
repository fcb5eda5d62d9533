#!/usr/bin/env python3
"""Write the facts of KubeRay's whole RayCluster schema (API version v1): every field at
every depth, with its type, which fields are required, and the value rules the API server
checks by itself (enum, pattern, maxLength, minimum, nullable, int-or-string, unknown
fields kept); no descriptions. The result goes to
tests/data/kuberay/rayclusters-<version>.json.gz, which tests/unit/test_kuberay_manifest.py
checks the shipped manifest (docs/operations/raycluster.yaml) against.

Usage: scripts/tools/kuberay_schema.py CRD_YAML VERSION
  CRD_YAML: ray-operator/config/crd/bases/ray.io_rayclusters.yaml of a KubeRay release
  (from a clone: git show VERSION:ray-operator/config/crd/bases/ray.io_rayclusters.yaml)
"""

from __future__ import annotations

import gzip
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEEP = (
    "type",
    "required",
    "enum",
    "pattern",
    "maxLength",
    "minimum",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
)


def facts(schema: dict) -> dict:
    """``schema`` without its descriptions and defaults: what a value is checked against."""
    out = {k: schema[k] for k in KEEP if k in schema}
    if "properties" in schema:
        out["properties"] = {n: facts(s) for n, s in sorted(schema["properties"].items())}
    extra = schema.get("additionalProperties")
    if extra is not None:
        out["additionalProperties"] = facts(extra) if isinstance(extra, dict) else extra
    if "items" in schema:
        out["items"] = facts(schema["items"])
    if "anyOf" in schema:
        out["anyOf"] = [facts(s) for s in schema["anyOf"]]
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    crd_path, version = sys.argv[1], sys.argv[2]
    crd = yaml.safe_load(pathlib.Path(crd_path).read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    written = {
        "origin": f"github.com/ray-project/kuberay {version}, "
        "ray-operator/config/crd/bases/ray.io_rayclusters.yaml (version v1), whole, "
        "descriptions left out, by scripts/tools/kuberay_schema.py",
        "schema": facts(v1["schema"]["openAPIV3Schema"]),
    }
    out = ROOT / "tests" / "data" / "kuberay" / f"rayclusters-{version}.json.gz"
    data = json.dumps(written, sort_keys=True, separators=(",", ":")).encode()
    out.write_bytes(gzip.compress(data, 9, mtime=0))  # the same CRD writes the same bytes
    print(f"wrote {out.relative_to(ROOT)} ({len(data)} bytes of JSON)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
