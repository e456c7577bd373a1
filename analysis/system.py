"""What each study ran on, from its runs' system records (bench/core/system.py; each run's summary keeps one
entry per node in extra["system"], bench/run/collect.py): the distinct systems of a study, whether it spans
more than one (its efficiency then mixes machines), the environment its runs saw, and every fact that
differs between two studies ("NCCL 2.21.5 -> 2.23.4", "FI_EFA_USE_DEVICE_RDMA unset -> 1").

A system is a node's facts less its identity (host, the scheduler's names: IDENTITY) and less its
environment, which a study varies on purpose (the NCCL network of each EFA count): two nodes of one
instance type, driver, image and software are one system. A fact missing on a node is "missing" whatever
the reason (the reasons are in system.csv), so "no GPU" and "no NVML" do not make two systems.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bench.core.system import is_missing

IDENTITY = ("host", "slurm_job_id", "slurm_nodelist", "k8s_pod")  # where a node is, not what
# Variables the launchers set per run or per node on purpose: a path into the run dir, the devices the local
# launcher gives each simulated node, the node's own name. Shown, never a difference between studies.
PER_RUN_ENV = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "CUDA_VISIBLE_DEVICES", "FSDPBENCH_NODE_NAME")
LABELS = {  # fact -> how the page and the comparison name it, most telling first
    "instance_type": "instance type", "gpu_model": "GPU", "gpu_count": "GPUs per node",
    "gpu_driver": "driver", "cuda_driver": "CUDA driver", "cuda_runtime": "CUDA (torch)", "cudnn": "cuDNN",
    "nccl": "NCCL", "nccl_printed": "NCCL printed", "nccl_wheel": "NCCL wheel", "libfabric": "libfabric",
    "aws_ofi_nccl": "aws-ofi-nccl", "rdma_devices": "RDMA devices", "gpu_topology": "GPU topology",
    "container_image": "image", "container_digest": "image digest", "torch": "torch",
    "transformers": "transformers", "torchao": "torchao", "python": "Python", "git_rev": "git",
    "git_dirty": "git tree dirty", "git_diff_sha256": "git diff", "gpu_memory_gib": "GPU memory (GiB)",
    "gpu_power_limit_w": "GPU power limit (W)", "gpu_sm_clock_max_mhz": "SM clock max (MHz)",
    "gpu_vbios": "VBIOS", "gpu_ecc": "ECC", "gpu_mig": "MIG", "gpu_visible": "GPUs visible",
    "cpu_model": "CPU", "cpu_isa": "CPU vector units", "cpu_count": "CPUs", "cpus_usable": "CPUs usable",
    "mem_total_gib": "memory (GiB)",
    "kernel": "kernel", "os": "OS", "dmi_vendor": "vendor", "libfabric_lib": "libfabric library",
    "aws_ofi_nccl_lib": "aws-ofi-nccl library", "numpy": "numpy", "nvidia_ml_py": "nvidia-ml-py",
}
# The page's table of a study's systems (system.csv keeps every fact of every node)
TABLE = ("instance_type", "gpu", "gpu_driver", "cuda", "nccl", "libfabric", "aws_ofi_nccl", "rdma_devices",
         "gpu_topology", "cpu_model", "cpu_isa", "kernel", "os", "container_image", "torch", "transformers",
         "python", "git_rev")
TABLE_LABELS = {"gpu": "GPU", "cuda": "CUDA driver / torch", **LABELS}
_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nvidia-smi's PCIe classes, nearest first
_DEVICE = re.compile(r"^(?:GPU|NIC)\d+$|^mlx5_\d+$")


@dataclass
class Entry:
    """One node of one run as its system record describes it."""

    run: str
    node: str
    facts: dict[str, str]  # fact -> shown value (show), the environment apart
    raw: dict[str, Any]  # fact -> as recorded
    env: dict[str, str]

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        """What makes it a system: every fact but its identity (its environment apart)."""
        return tuple(sorted((k, v) for k, v in self.facts.items() if k not in IDENTITY))


@dataclass
class System:
    """The runs and nodes a study ran one system on."""

    entries: list[Entry]

    @property
    def facts(self) -> dict[str, str]:
        return self.entries[-1].facts

    @property
    def nodes(self) -> list[str]:
        return sorted({e.node for e in self.entries})

    @property
    def runs(self) -> set[str]:
        return {e.run for e in self.entries}


def topology_summary(text: str) -> str:
    """`nvidia-smi topo -m` in one line: the links between GPUs ("8 GPUs NV18"; mixed links with their pair
    counts) and, where there are NICs, each GPU's nearest ("10 NICs, nearest PIX")."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return "empty"
    devices = [t for t in lines[0].split() if _DEVICE.match(t)]
    gpus = [line.split() for line in lines[1:] if re.match(r"^GPU\d+\s", line)]
    nics = [d for d in devices if not d.startswith("GPU")]
    pairs: Counter[str] = Counter()
    nearest: Counter[str] = Counter()
    for i, row in enumerate(gpus):
        cells = row[1:1 + len(devices)]
        pairs.update(c for j, c in enumerate(cells[:len(gpus)]) if j > i)
        links = [c for c in cells[len(gpus):] if c in _LINKS]
        if links:
            nearest[min(links, key=_LINKS.index)] += 1
    if len(pairs) == 1:
        between = f"{len(gpus)} GPUs {next(iter(pairs))}"
    else:
        between = f"{len(gpus)} GPUs " + ", ".join(f"{k} x{n}" for k, n in sorted(pairs.items())) if pairs \
            else f"{len(gpus)} GPU"
    if not nics:
        return between
    near = "/".join(sorted(nearest, key=_LINKS.index)) or "?"
    return f"{between}; {len(nics)} NICs, nearest {near}"


def _devices(names: list[str]) -> str:
    """RDMA devices by kind: "32 rdmap", "8 mlx5_ + 1 ibp"; "none"."""
    kinds = Counter(re.sub(r"\d.*$", "", n) or n for n in names)
    return " + ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"


def show(fact: str, value: Any) -> str:
    """A fact as the page shows it and as two nodes are compared by."""
    if is_missing(value):
        return "missing"
    if fact == "gpu_topology":
        return topology_summary(str(value))
    if fact == "rdma_devices" and isinstance(value, list):
        return _devices(value)
    if fact == "git_rev":
        return str(value)[:12]
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _extra(cell: Any) -> dict[str, Any]:
    if isinstance(cell, dict):
        return cell
    try:
        out = json.loads(cell) if isinstance(cell, str) and cell else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


@dataclass
class SystemRecords:
    """The system records of one sweep's runs (an entry per node of each run), oldest run first, and what
    could not be read: what the report's system tables and the comparison of two studies read."""

    entries: list[Entry] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (run id, why)
    runs_without: int = 0  # runs with no system record at all (older ones, or none written)

    @property
    def nodes(self) -> dict[str, Entry]:
        """Each node's last entry (its facts as its last run recorded them)."""
        return {e.node: e for e in self.entries}

    def systems(self) -> list[System]:
        """The distinct systems, the most nodes first: a node whose facts changed between runs (a driver
        upgraded mid-study) is in two."""
        groups: dict[tuple[tuple[str, str], ...], list[Entry]] = {}
        for entry in self.entries:
            groups.setdefault(entry.key, []).append(entry)
        return sorted((System(e) for e in groups.values()), key=lambda s: (-len(s.nodes), -len(s.runs)))


def system_records(frame: pd.DataFrame) -> dict[str, SystemRecords]:
    """Per sweep, the system records of its runs, oldest run first."""
    out: dict[str, SystemRecords] = {}
    order = frame.sort_values("started_at", na_position="first") if "started_at" in frame else frame
    for _, row in order.iterrows():
        records = out.setdefault(str(row["sweep"]), SystemRecords())
        entries = _extra(row.get("extra")).get("system")
        if not isinstance(entries, list) or not entries:
            records.runs_without += 1
            continue
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("facts"), dict):
                why = entry.get("unreadable") if isinstance(entry, dict) else None
                records.unreadable.append((str(row["run_id"]), str(why or "not an entry")))
                continue
            raw = {k: v for k, v in entry["facts"].items() if k != "env"}
            env = entry["facts"].get("env")
            records.entries.append(Entry(str(row["run_id"]), str(entry.get("node")),
                                       {k: show(k, v) for k, v in raw.items()}, raw,
                                       env if isinstance(env, dict) else {}))
    return out


def _cell(column: str, facts: dict[str, str]) -> str:
    if column == "gpu":
        model, count = facts.get("gpu_model", "missing"), facts.get("gpu_count", "missing")
        return model if model == "missing" or count == "missing" else f"{count} x {model}"
    if column == "cuda":
        driver, runtime = facts.get("cuda_driver", "missing"), facts.get("cuda_runtime", "missing")
        return "missing" if driver == runtime == "missing" else f"{driver} / {runtime}"
    if column == "nccl":
        mine, printed = facts.get("nccl", "missing"), facts.get("nccl_printed", "missing")
        same = printed in ("missing", mine) or printed.startswith(mine + "+")  # "2.21.5+cuda12.4"
        return mine if same else f"{mine} ({printed} printed)"
    if column == "git_rev" and facts.get("git_dirty") == "yes":
        return f"{facts.get('git_rev', 'missing')} (dirty {facts.get('git_diff_sha256', '?')})"
    if column == "container_image" and facts.get("container_digest", "missing") != "missing":
        return f"{facts.get('container_image')} ({facts['container_digest'][:19]})"
    return facts.get(column, "missing")


def _names(names: list[str], most: int = 4) -> str:
    names = sorted(set(names))
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def system_table(records: SystemRecords) -> pd.DataFrame:
    """A row per distinct system of a study: its nodes, runs and facts; columns every system lacks are
    left out (missing_facts names them, with why)."""
    rows = [{"nodes": f"{len(s.nodes)} ({_names(s.nodes)})", "runs": len(s.runs),
             **{TABLE_LABELS[c]: _cell(c, s.facts) for c in TABLE}} for s in records.systems()]
    table = pd.DataFrame(rows)
    keep = [c for c in table.columns if c in ("nodes", "runs") or (table[c] != "missing").any()]
    return table[keep]


def node_table(by_sweep: dict[str, SystemRecords]) -> pd.DataFrame:
    """system.csv: a row per study and node, every fact as recorded (a missing one with its reason)."""
    rows = []
    for sweep, records in by_sweep.items():
        for name, last in records.nodes.items():
            facts = {k: f"missing: {v['missing']}" if is_missing(v) else str(v) if k == "gpu_topology"
                     else show(k, v) for k, v in last.raw.items()}
            runs = len({e.run for e in records.entries if e.node == name})
            rows.append({"sweep": sweep, "node": name, "runs": runs, **facts})
    return pd.DataFrame(rows)


def env_table(records: SystemRecords) -> pd.DataFrame:
    """The environment the study's runs saw, a row per variable and value, with how many runs saw it."""
    seen: dict[tuple[str, str], set[str]] = {}
    names = sorted({k for e in records.entries for k in e.env})
    for entry in records.entries:
        for name in names:
            value = entry.env.get(name, "unset")
            if name in PER_RUN_ENV and value != "unset":
                value = "(set per run or node by the launcher)"
            seen.setdefault((name, value), set()).add(entry.run)
    rows = [{"variable": k, "value": v, "runs": len(runs)} for (k, v), runs in sorted(seen.items())]
    return pd.DataFrame(rows, columns=["variable", "value", "runs"])


def _differs(rest: dict[str, str], odd: dict[str, str]) -> list[str]:
    """The facts where a node differs from the majority's, as "NCCL 2.23.4 where the rest have 2.21.5"."""
    keys = [k for k in [*LABELS, *sorted(set(odd) | set(rest))] if k not in IDENTITY]
    return [f"{LABELS.get(k, k)} {odd.get(k, 'not recorded')} where the rest have "
            f"{rest.get(k, 'not recorded')}" for k in dict.fromkeys(keys) if odd.get(k) != rest.get(k)]


def missing_facts(sweep: str, records: SystemRecords) -> list[str]:
    """The facts none of a sweep's nodes recorded, with why (the page's system notes, beside its table)."""
    reasons: dict[str, list[str]] = {}
    if records.nodes:
        for k, v in records.entries[0].raw.items():
            if k not in IDENTITY and is_missing(v) and all(is_missing(e.raw.get(k)) for e in records.entries):
                reasons.setdefault(str(v["missing"]), []).append(LABELS.get(k, k))
    return [f"{sweep}: not recorded on any node: {', '.join(facts)} ({why})"
            for why, facts in reasons.items()]


def unread_records(sweep: str, records: SystemRecords) -> list[str]:
    """Records that could not be read, and runs without one: nodes whose facts the report does not know
    (the page's notes)."""
    notes = []
    if records.unreadable:
        run, why = records.unreadable[0]
        notes.append(f"{sweep}: {len(records.unreadable)} system record(s) unreadable, their nodes' facts "
                     f"unknown (run {run}: {why})")
    if records.runs_without:
        notes.append(f"{sweep}: {records.runs_without} run(s) without a system record (written before runs "
                     "recorded one, or the worker died first)")
    return notes


def spans(sweep: str, records: SystemRecords) -> str | None:
    """The first screen's warning for a study whose nodes are not one system, naming how they differ."""
    systems = records.systems()
    if len(systems) < 2:
        return None
    majority, minority = systems[0], sorted({n for s in systems[1:] for n in s.nodes})
    differs = list(dict.fromkeys(d for s in systems[1:] for d in _differs(majority.facts, s.facts)))
    return (f"{sweep} spans {len(systems)} systems: {len(minority)} of {len(records.nodes)} nodes differ "
            f"({_names(minority)}: {'; '.join(differs[:4])}{'; ...' if len(differs) > 4 else ''}): its "
            "scaling efficiency mixes machines")


# ---------------------------------------------------------------------------------------------- two studies

def _side(by_sweep: dict[str, SystemRecords]) -> tuple[dict[str, Counter[str]], dict[str, set[str]], int]:
    """Per fact, how many nodes show each value; per variable, the values the runs saw; the node count."""
    seen: dict[str, dict[str, set[tuple[str, str]]]] = {}  # fact -> value -> its (study, node)s
    env: dict[str, set[str]] = {}
    entries = [(sweep, e) for sweep, s in by_sweep.items() for e in s.entries]
    names = {k for _, e in entries for k in e.env} - set(PER_RUN_ENV)
    for sweep, entry in entries:
        for k, v in entry.facts.items():
            if k not in IDENTITY:
                seen.setdefault(k, {}).setdefault(v, set()).add((sweep, entry.node))
        for name in names:
            env.setdefault(name, set()).add(entry.env.get(name, "unset"))
    facts = {k: Counter({v: len(nodes) for v, nodes in values.items()}) for k, values in seen.items()}
    return facts, env, len({(sweep, e.node) for sweep, e in entries})


def _values(counts: Counter[str] | None, nodes: int) -> str:
    if not counts:
        return "not recorded"
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{v} ({n} of {nodes} nodes)" for v, n in counts.most_common())


def unrecorded(a: dict[str, SystemRecords], b: dict[str, SystemRecords]) -> list[str]:
    """The side(s) with no system record to compare, where the other has some (differences says nothing
    then: a baseline from before runs recorded their systems)."""
    counts = {label: sum(len(s.nodes) for s in side.values()) for label, side in (("A", a), ("B", b))}
    if not any(counts.values()):
        return ["no system records on either side"]
    return [f"{label}: no system records (runs from before they were written, or none readable): nothing "
            "to compare" for label, n in counts.items() if not n]


def differences(a: dict[str, SystemRecords], b: dict[str, SystemRecords]) -> list[str]:
    """Every system fact and environment variable that differs between two sets of studies, baseline
    first: "NCCL 2.21.5 -> 2.23.4", "FI_EFA_USE_DEVICE_RDMA unset -> 1"; then, per side whose nodes are not
    one system, how many differ ("B: 2 nodes of 16 differ (...)"). Empty where both have no record."""
    (fa, ea, na), (fb, eb, nb) = _side(a), _side(b)
    if not na or not nb:  # a side of runs from before the records: every fact would read "not recorded"
        return []
    lines = []
    for k in dict.fromkeys([*LABELS, *sorted(set(fa) | set(fb))]):
        if k in fa or k in fb:
            if set(fa.get(k, {})) != set(fb.get(k, {})) or (len(fa.get(k, {})) > 1 and fa[k] != fb.get(k)):
                lines.append(f"{LABELS.get(k, k)} {_values(fa.get(k), na)} -> {_values(fb.get(k), nb)}")
    for name in sorted(set(ea) | set(eb)):
        if ea.get(name, {"unset"}) != eb.get(name, {"unset"}):
            lines.append(f"{name} {', '.join(sorted(ea.get(name, {'unset'})))} -> "
                         f"{', '.join(sorted(eb.get(name, {'unset'})))}")
    for label, side in (("A", a), ("B", b)):
        for sweep, records in side.items():
            systems = records.systems()
            if len(systems) > 1:
                odd = sorted({n for s in systems[1:] for n in s.nodes})
                lines.append(f"{label} ({sweep}): {len(odd)} nodes of {len(records.nodes)} differ "
                             f"({_names(odd)})")
    return lines
