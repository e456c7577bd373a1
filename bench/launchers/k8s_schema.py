"""Validate Kubeflow manifests against the real CRD schemas, plus the rules only the webhooks check.

The CRDs' openAPIV3Schema is used with jsonschema's Draft 7 validator; `strict` adds
additionalProperties=false to every object that lists its properties (except where the CRD preserves
unknown fields), so a misspelt key fails here instead of being dropped by the API server. The training
operator's webhook (not the CRD) requires Master/Worker replica keys and a container named "pytorch";
the MPI operator needs one Launcher and a Worker.
"""
from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from bench.launchers.base import PROJECT_ROOT

CRD_FILES = {"PyTorchJob": "kubeflow.org_pytorchjobs.yaml", "MPIJob": "kubeflow.org_mpijobs.yaml"}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def crd_dir() -> Path:
    """Where the CRD YAMLs are: $FSDPBENCH_CRD_DIR, else the reference data beside the checkout."""
    return Path(os.environ.get("FSDPBENCH_CRD_DIR", PROJECT_ROOT.parent / "shared" / "data" / "k8s"))


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=8)
def _validator(kind: str, version: str, directory: str, strict: bool) -> jsonschema.Draft7Validator:
    path = Path(directory) / CRD_FILES[kind]
    crd = yaml.safe_load(path.read_text())
    version_spec = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = copy.deepcopy(version_spec["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(_strict(schema) if strict else schema)


def _webhook_errors(obj: dict[str, Any]) -> list[str]:
    errors = []
    name = obj.get("metadata", {}).get("name", "")
    if not _DNS1035.match(name) or len(name) > 63:
        errors.append(f"metadata.name {name!r} is not a DNS-1035 label of <= 63 characters")
    spec = obj.get("spec", {})
    if obj.get("kind") == "PyTorchJob":
        replicas = spec.get("pytorchReplicaSpecs", {})
        for key, rs in replicas.items():
            if key not in ("Master", "Worker"):
                errors.append(f"pytorchReplicaSpecs: replica type {key!r} is not Master or Worker")
            containers = rs.get("template", {}).get("spec", {}).get("containers", [])
            if not any(c.get("name") == "pytorch" for c in containers):
                errors.append(f"pytorchReplicaSpecs.{key}: no container named 'pytorch'")
        if replicas.get("Master", {}).get("replicas", 1) != 1:
            errors.append("pytorchReplicaSpecs.Master.replicas must be 1")
    if obj.get("kind") == "MPIJob":
        replicas = spec.get("mpiReplicaSpecs", {})
        if replicas.get("Launcher", {}).get("replicas") != 1:
            errors.append("mpiReplicaSpecs.Launcher must have exactly 1 replica")
        if "Worker" not in replicas:
            errors.append("mpiReplicaSpecs.Worker is missing")
        for key in replicas:
            if key not in ("Launcher", "Worker"):
                errors.append(f"mpiReplicaSpecs: replica type {key!r} is not Launcher or Worker")
    return errors


def validate(obj: dict[str, Any], strict: bool = True, directory: Path | None = None) -> list[str]:
    """Every problem with a manifest, as 'path: message' lines; empty when it is valid."""
    kind, api_version = obj.get("kind"), obj.get("apiVersion", "")
    if kind not in CRD_FILES:
        return [f"kind {kind!r} is not one of {', '.join(CRD_FILES)}"]
    group, _, version = api_version.partition("/")
    if group != "kubeflow.org":
        return [f"apiVersion {api_version!r} is not in group kubeflow.org"]
    try:
        validator = _validator(kind, version, str(directory or crd_dir()), strict)
    except StopIteration:
        return [f"{kind} CRD has no version {version!r}"]
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    return errors + _webhook_errors(obj)
