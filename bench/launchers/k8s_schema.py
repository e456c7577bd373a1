"""Validate Kubeflow manifests against the CRD schemas the cluster serves, plus the rules only the
webhooks check.

The launcher reads the installed CRDs through the API (apiextensions.k8s.io/v1) at preflight, so a manifest
is checked against the operator versions that will run it; tests pass the CRD files of ../shared/data/k8s.
The CRDs' openAPIV3Schema is used with jsonschema's Draft 7 validator; `strict` adds
additionalProperties=false to every object that lists its properties (except where the CRD preserves
unknown fields), so a misspelt key fails here instead of being dropped by the API server. The training
operator's webhook (not the CRD) requires Master/Worker replica keys and a container named "pytorch";
the MPI operator needs one Launcher and a Worker.
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema

from bench.core.yaml_text import safe_load

CRD_NAMES = {"PyTorchJob": "pytorchjobs.kubeflow.org", "MPIJob": "mpijobs.kubeflow.org"}
CRD_FILES = {"PyTorchJob": "kubeflow.org_pytorchjobs.yaml", "MPIJob": "kubeflow.org_mpijobs.yaml"}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@functools.lru_cache(maxsize=4)
def load_crds(directory: Path) -> dict[str, dict[str, Any]]:
    """CRD objects by kind from the operators' YAML files (tests, or a cluster-less check); read once, with
    libyaml's parser where PyYAML has it (the two CRDs are 1.2 MB: 1.5 s each in pure Python)."""
    return {kind: safe_load((directory / name).read_text()) for kind, name in CRD_FILES.items()
            if (directory / name).is_file()}


def served_versions(crd: dict[str, Any]) -> list[str]:
    return [v["name"] for v in crd["spec"]["versions"] if v.get("served", True)]


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


_VALIDATORS: dict[tuple[int, str, bool], tuple[dict[str, Any], jsonschema.Draft7Validator]] = {}


def _validator(crd: dict[str, Any], version: str, strict: bool) -> jsonschema.Draft7Validator:
    """One validator per CRD object and version (building one copies a schema of thousands of lines)."""
    key = (id(crd), version, strict)
    if key in _VALIDATORS and _VALIDATORS[key][0] is crd:  # the CRD is kept alive with it: ids stay unique
        return _VALIDATORS[key][1]
    version_spec = next(v for v in crd["spec"]["versions"] if v["name"] == version and v.get("served", True))
    schema = copy.deepcopy(version_spec["schema"]["openAPIV3Schema"])
    validator = jsonschema.Draft7Validator(_strict(schema) if strict else schema)
    _VALIDATORS[key] = (crd, validator)
    return validator


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


def validate(obj: dict[str, Any], crds: dict[str, dict[str, Any]], strict: bool = True) -> list[str]:
    """Every problem with a manifest against `crds` (kind -> CRD object), as 'path: message' lines; empty
    when it is valid."""
    kind, api_version = obj.get("kind"), obj.get("apiVersion", "")
    if kind not in CRD_FILES:
        return [f"kind {kind!r} is not one of {', '.join(CRD_FILES)}"]
    group, _, version = api_version.partition("/")
    if group != "kubeflow.org":
        return [f"apiVersion {api_version!r} is not in group kubeflow.org"]
    if kind not in crds:
        return [f"the cluster has no {kind} CRD ({CRD_NAMES[kind]}): install the "
                f"{'training' if kind == 'PyTorchJob' else 'MPI'} operator"]
    try:
        validator = _validator(crds[kind], version, strict)
    except StopIteration:
        return [f"{kind} CRD serves no version {version!r} "
                f"(it serves {', '.join(served_versions(crds[kind]))})"]
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    return errors + _webhook_errors(obj)
