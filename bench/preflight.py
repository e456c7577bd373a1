"""`python -m bench.preflight +sweep=NAME`: check every node of the study's cluster before its first run.

At 16 nodes one bad node sets the pace of all of them, and synchronous FSDP hides which: every rank waits in
the same collectives. So, through the study's own launcher: one short job per node, all in parallel
(`python -m trainer.preflight`: versions, GPUs, EFA adapters, free space, a local workload timed with no
communication), then all-reduce between pairs of nodes (`python -m nccl.probe` or nccl-tests, as the
study's probes), each node in two pairs where there are three nodes or more, so a bad node shows in both
its pairs and a bad link in one. The verdict is a table, one row a node, naming what sets a node apart: a
speed more than `preflight.tolerance` below the median node's, versions other than the majority's, fewer
GPUs or EFA adapters than the study asks, ECC errors, clocks held down, a node that did not answer.

`bench.sweep` runs it first on launchers that reach several machines (preflight.mode=auto) and refuses a
study whose nodes disagree unless preflight.mode=warn; the table is kept in the sweep dir
(bench.core.rundir.PREFLIGHT_JSON) and shown in the report. Every job is cleaned up however the check ends.
"""
from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core import rundir
from bench.core.config import ConfigError, PreflightConfig, SweepConfig
from bench.core.records import error_line
from bench.core.schema import RunSpec
from bench.launchers.base import DONE, Launcher, Placement
from bench.probes.records import run_records
from bench.run.watch import now_iso

EXIT_REFUSED = 3  # bench.sweep and this command: the nodes disagree (preflight.mode=on)
# NVML's clock throttle reasons that mean a GPU is held below its clocks by its state, not by its load:
# HW slowdown, SW thermal, HW thermal, HW power brake (nvml.h nvmlClocksThrottleReason*)
BAD_THROTTLE = {0x8: "hardware slowdown", 0x20: "software thermal", 0x40: "hardware thermal",
                0x80: "power brake"}
VERSIONS = (("torch", "torch"), ("python", "Python"), ("cuda", "CUDA"), ("nccl", "NCCL"),
            ("driver", "driver"), ("gpu", "GPU"), ("libfabric", "libfabric"), ("ofi_plugin", "aws-ofi-nccl"))
SPEEDS = (("matmul_tflops", "matmul TFLOPS"), ("copy_gbs", "copy GB/s"),
          ("pair_busbw_gbs", "all-reduce GB/s"))
MIN_FREE_GIB = 1.0


@dataclass(frozen=True)
class Nodes:
    """What the preflight reads of a study (`nodes_of` builds it once from the configuration): how to check,
    and what every node must have."""

    settings: PreflightConfig
    cluster: str
    """The cluster's name, which every job's spec carries."""
    launcher: str
    """The launcher each job's spec records (the placement's)."""
    gpus_per_node: int
    """Workers per node of each job (the cluster's GPUs per node)."""
    gpus: int | None
    """GPUs a node must have (the cluster's, where its file names a GPU); None: not checked."""
    efa: int
    """EFA adapters a node must have: the most any run or probe of the study asks."""
    precision: str
    """The dtype the local workload runs in: the study's first precision."""


def nodes_of(cfg: SweepConfig, placement: Placement) -> Nodes:
    asked = [e for e in [*cfg.axes.efa_per_node, *(cfg.nccl.efa_per_node or [])] if e is not None]
    return Nodes(settings=cfg.preflight, cluster=cfg.cluster.name, launcher=placement.run_launcher,
                 gpus_per_node=cfg.cluster.gpus_per_node,
                 gpus=cfg.cluster.gpus_per_node if cfg.cluster.gpu else None,
                 efa=max(asked or [cfg.cluster.efa_per_node]), precision=cfg.axes.precision[0])


def mode_of(mode: str, placement: Placement) -> str:
    """on, warn or off: auto is on where the launcher reaches several machines (its placement says)."""
    if mode != "auto":
        return mode
    return "on" if placement.preflight else "off"


def node_spec(nodes: Nodes, node: str) -> RunSpec:
    return RunSpec(kind="preflight", nodes=1, gpus_per_node=nodes.gpus_per_node, precision=nodes.precision,
                   efa_per_node=nodes.efa, cluster=nodes.cluster, launcher=nodes.launcher, hosts=node)


# Timed all-reduces per size between a pair: enough for a steady reading when other pairs measure beside it
# on shared cores, at well under a second per size (benchmarks/evidence/README.md, "Preflight").
PAIR_ITERS = 20


def pair_spec(nodes: Nodes, pair: tuple[str, str]) -> RunSpec:
    top = nodes.settings.pair_bytes
    return RunSpec(kind="nccl", nodes=2, gpus_per_node=nodes.gpus_per_node, efa_per_node=nodes.efa,
                   cluster=nodes.cluster, launcher=nodes.launcher, hosts=",".join(pair),
                   nccl_min_bytes=max(8, top // 64), nccl_max_bytes=top, nccl_iters=PAIR_ITERS)


def pair_rounds(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """Pairs of neighbours on a ring (every node in two pairs; one pair of two nodes), in rounds of pairs
    that share no node, so a round runs side by side."""
    n = len(nodes)
    if n < 2:
        return []
    pairs = [(nodes[0], nodes[1])] if n == 2 else [(nodes[i], nodes[(i + 1) % n]) for i in range(n)]
    rounds: list[list[tuple[str, str]]] = []
    for pair in pairs:
        slot = next((r for r in rounds if not {*pair} & {x for p in r for x in p}), None)
        if slot is None:
            rounds.append(slot := [])
        slot.append(pair)
    return rounds


@dataclass
class Answer:
    """One preflight job: its workers' records, else why there are none."""

    records: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    left: str | None = None  # what its cleanup left behind, and the command that removes it


def run_round(launcher: Launcher, specs: list[RunSpec], sweep_dir: Path, timeout_s: float
              ) -> dict[str, Answer]:
    """Submit every spec at once, wait for all (at most timeout_s, queueing included), read their records.
    Every job is cleaned up on the way out, Ctrl-C included; a job still going at the deadline is named."""
    handles: dict[str, tuple[Any, Path]] = {}
    answers: dict[str, Answer] = {}
    by_id = {spec.run_id: spec for spec in specs}
    try:
        for spec in specs:
            attempt = rundir.attempt_dir(rundir.preflight_run_dir(sweep_dir, spec), 1)
            try:
                submission = launcher.render(spec, attempt)
                rundir.write_submission(attempt, submission)
                handles[spec.run_id] = (launcher.submit(submission, attempt), attempt)
            except Exception as e:  # noqa: BLE001 - one node's submission failing is that node's answer
                answers[spec.run_id] = Answer(error=f"could not be submitted: {error_line(e)}")
        deadline = time.monotonic() + timeout_s
        while len(answers) < len(specs) and time.monotonic() < deadline:
            for run_id, (handle, attempt) in handles.items():
                if run_id not in answers and launcher.poll(handle).state == DONE:
                    launcher.logs(handle, attempt)
                    records = run_records(attempt, by_id[run_id])
                    answers[run_id] = Answer(records, None if records else "finished without an answer")
            time.sleep(0.5)
        for run_id in handles.keys() - answers.keys():
            answers[run_id] = Answer(error=f"no answer within preflight.timeout_s={timeout_s:g} s")
    finally:
        for handle, _ in handles.values():
            launcher.cleanup(handle)
    for run_id, (handle, _) in handles.items():
        answers[run_id].left = wait_removed(launcher, handle)
    return answers


def wait_removed(launcher: Launcher, handle: Any) -> str | None:
    """Wait until what cleanup deleted is gone (nothing else runs meanwhile); what is left when the launcher
    stops waiting for it, else None (gone, or it cannot tell)."""
    try:
        while (left := launcher.remains(handle)) is not None and not left.final:
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 - cannot tell: the check's verdict stands without it
        return None
    return left.what if left else None


def say_left(answers: dict[str, Answer], out: Any) -> None:
    for answer in answers.values():
        if answer.left:
            print(f"preflight: {answer.left}", file=out, flush=True)


def node_row(node: str, answer: Answer) -> dict[str, Any]:
    """One node's facts, its slowest GPU's speeds (a node is as fast as its slowest rank)."""
    facts = [r for r in answer.records if r.get("kind") == "preflight" and "error" not in r]
    if not facts:
        errors = [r["error"] for r in answer.records if r.get("error")]
        return {"node": node, "answered": False,
                "problems": [answer.error or (errors[0] if errors else "no answer")]}
    first = facts[0]
    row: dict[str, Any] = {"node": node, "answered": True, "ranks": len(facts), "problems": []}
    for key, _ in VERSIONS:
        row[key] = first.get(key)
    for key in ("gpus", "efa_adapters", "results_free_gib", "threads", "dtype", "ofi_plugin_loads",
                "ofi_plugin_error", "met"):
        row[key] = first.get(key)
    row["matmul_tflops"] = min(f["matmul_tflops"] for f in facts)
    row["copy_gbs"] = min(f["copy_gbs"] for f in facts)
    row["ecc_uncorrected"] = sum(f.get("ecc_uncorrected") or 0 for f in facts)
    row["throttled"] = sorted({name for f in facts for bit, name in BAD_THROTTLE.items()
                               if (f.get("throttle_reasons") or 0) & bit})
    return row


def busbw_of(answer: Answer) -> float | None:
    """The largest message's bus bandwidth of a pair's all-reduce (GB/s): the probe's rows, or nccl-tests'
    table parsed from the logs."""
    sizes = [r for r in answer.records if r.get("kind") == "nccl" and r.get("busbw") is not None]
    return max(sizes, key=lambda r: r.get("size", 0))["busbw"] if sizes else None


Pairs = dict[tuple[str, str], float | None]  # a pair of nodes' all-reduce bus bandwidth (GB/s)


def judge(nodes: Nodes, rows: list[dict[str, Any]], pairs: Pairs) -> list[str]:
    """Name what sets each node apart (each row's `problems`); returns the problems of no single node
    (a slow link between two nodes that are fine with their other neighbour)."""
    tol, answered = nodes.settings.tolerance, [r for r in rows if r["answered"]]
    for row in answered:  # a node's best pair: one fine pair clears the node (the other is the link)
        own = [bw for pair, bw in pairs.items() if row["node"] in pair]
        row["pair_busbw_gbs"] = max((bw for bw in own if bw is not None), default=None)
    for key, label in SPEEDS:
        values = [r[key] for r in answered if r.get(key) is not None]
        if len(values) < 2:
            continue
        median = statistics.median(values)
        for row in answered:
            if row.get(key) is not None and row[key] < median * (1 - tol):
                row["problems"].append(f"{label} {row[key]:.3g}, {1 - row[key] / median:.0%} below the "
                                       f"median {median:.3g}")
    for key, label in VERSIONS:
        counts: dict[Any, int] = {}
        for row in answered:
            counts[row.get(key)] = counts.get(row.get(key), 0) + 1
        if len(counts) > 1:
            common, n = max(counts.items(), key=lambda kv: kv[1])
            for row in answered:
                if row.get(key) != common:
                    row["problems"].append(
                        f"{label} {row.get(key)} where {n} of {len(answered)} have {common}")
    efa, gpus = nodes.efa, nodes.gpus
    for row in answered:
        if (row.get("efa_adapters") or 0) < efa:
            row["problems"].append(f"{row.get('efa_adapters') or 0} EFA adapters, the study asks {efa}")
        if gpus and (row.get("gpus") or 0) < gpus:
            row["problems"].append(f"{row.get('gpus') or 0} GPUs, the cluster has {gpus} per node")
        if row.get("ofi_plugin_loads") is False:  # NCCL would fail to load it, or fall back to sockets
            row["problems"].append(f"aws-ofi-nccl does not load: {row.get('ofi_plugin_error')}")
        if row.get("ecc_uncorrected"):
            row["problems"].append(f"{row['ecc_uncorrected']} uncorrected ECC errors")
        if row.get("throttled"):
            row["problems"].append("clocks held down: " + ", ".join(row["throttled"]))
        if row.get("results_free_gib") is not None and row["results_free_gib"] < MIN_FREE_GIB:
            row["problems"].append(f"{row['results_free_gib']:.2f} GiB free where results are written")
    return _slow_links(pairs, tol, rows)


def _slow_links(pairs: Pairs, tol: float, rows: list[dict[str, Any]]) -> list[str]:
    """A pair below the median pair whose nodes each have a fine pair elsewhere: the link, not a node."""
    values = [bw for bw in pairs.values() if bw is not None]
    if len(values) < 3:
        return []
    median, slow_nodes = statistics.median(values), {r["node"] for r in rows if any(
        p.startswith("all-reduce") for p in r["problems"])}
    return [f"all-reduce {a}-{b} {bw:.3g} GB/s, {1 - bw / median:.0%} below the median pair's {median:.3g}"
            for (a, b), bw in pairs.items()
            if bw is not None and bw < median * (1 - tol) and not {a, b} & slow_nodes]


@contextlib.contextmanager
def meeting(sweep_dir: Path, ranks: int) -> Iterator[None]:
    """Where node jobs that share this machine meet before timing their workload (the launchers pass the
    directory where the cluster is this machine: bench.launchers.base.preflight_args): how many ranks
    come, written before any job starts; removed after."""
    ready = rundir.preflight_ready_dir(sweep_dir)
    shutil.rmtree(ready, ignore_errors=True)
    ready.mkdir(parents=True)
    (ready / "expected").write_text(str(ranks))
    try:
        yield
    finally:
        shutil.rmtree(ready, ignore_errors=True)


Listed = tuple[list[str], dict[str, str]]  # the nodes to check, and those the scheduler holds down


def check(nodes: Nodes, launcher: Launcher, sweep_dir: Path, out: Any = sys.stderr,
          listed: Listed | None = None) -> dict[str, Any]:
    """Run the preflight on the nodes listed (before anything was written: `cluster_nodes`; None: list them
    now); write and return the verdict (rows, links, when, how long)."""
    started, settings = time.monotonic(), nodes.settings
    names, down = listed or cluster_nodes(settings, launcher)
    print(f"preflight: {len(names)} node(s) with {launcher.name}, one job each ...", file=out, flush=True)
    specs = {node: node_spec(nodes, node) for node in names}
    with meeting(sweep_dir, len(specs) * nodes.gpus_per_node):
        answers = run_round(launcher, list(specs.values()), sweep_dir, settings.timeout_s)
    say_left(answers, out)
    rows = [node_row(node, answers[spec.run_id]) for node, spec in specs.items()]
    rows += [{"node": node, "answered": False, "problems": [f"down in the scheduler ({state})"]}
             for node, state in down.items()]
    ready = [r["node"] for r in rows if r["answered"]]
    pairs: dict[tuple[str, str], float | None] = {}
    for i, pair_round in enumerate(pair_rounds(ready), 1):
        print(f"preflight: all-reduce between pairs of nodes, round {i}: "
              + ", ".join("-".join(p) for p in pair_round), file=out, flush=True)
        pair_specs = {pair: pair_spec(nodes, pair) for pair in pair_round}
        got = run_round(launcher, list(pair_specs.values()), sweep_dir, settings.timeout_s)
        say_left(got, out)
        pairs.update({pair: busbw_of(got[spec.run_id]) for pair, spec in pair_specs.items()})
    links = judge(nodes, rows, pairs)
    verdict = {"when": now_iso(), "seconds": round(time.monotonic() - started, 1), "tolerance":
               settings.tolerance, "rows": rows, "links": links,
               "pairs": [{"nodes": list(p), "busbw_gbs": bw} for p, bw in pairs.items()]}
    rundir.write_json(sweep_dir / rundir.PREFLIGHT_JSON, verdict)
    return verdict


def cluster_nodes(settings: PreflightConfig, launcher: Launcher) -> Listed:
    """The nodes to check, and those the scheduler holds down (by state); a ConfigError where there are
    none (the launcher's own, naming its selector, where it has one)."""
    if settings.nodes:
        return list(settings.nodes), {}
    names, down = launcher.node_names()
    if not names and not down:
        raise ConfigError("preflight: the launcher lists no nodes; name them with preflight.nodes=[...]")
    return names, down


def nodes_to_check(cfg: SweepConfig, placement: Placement, launcher: Launcher) -> Listed | None:
    """The nodes a sweep's preflight will check, listed before anything is written, so that a cluster
    without them is one line and exit 2; None where the preflight is off."""
    if mode_of(cfg.preflight.mode, placement) == "off":
        return None
    return cluster_nodes(cfg.preflight, launcher)


def refusal(verdict: dict[str, Any], launcher: Launcher) -> str:
    """The sweep's one line for a verdict that refuses the study: the first thing named, and how to go on
    (the launcher's setting that leaves the named nodes out, or preflight.mode=warn)."""
    named = problems(verdict)
    more = f" (and {len(named) - 1} more)" if len(named) > 1 else ""
    nodes = [r["node"] for r in verdict["rows"] if r["problems"]]
    leave = f"leave the node out ({launcher.leave_out(nodes)}) or " if nodes else ""
    return f"error: preflight: {named[0]}{more}; nothing launched: {leave}accept it with preflight.mode=warn"


def problems(verdict: dict[str, Any]) -> list[str]:
    """One line per node or link that sets itself apart."""
    return ([f"{r['node']}: " + "; ".join(r["problems"]) for r in verdict["rows"] if r["problems"]]
            + verdict["links"])


def format_verdict(verdict: dict[str, Any]) -> str:
    """The table, one row a node, then what is named."""
    head = ["node", "matmul TFLOPS", "copy GB/s", "all-reduce GB/s", "torch", "NCCL", "driver", "EFA",
            "verdict"]
    lines = []
    for r in verdict["rows"]:
        cells = [r["node"]] + [f"{r[k]:.3g}" if r.get(k) is not None else "-"
                               for k in ("matmul_tflops", "copy_gbs", "pair_busbw_gbs")]
        cells += ["-" if r.get(k) is None else str(r[k]) for k in ("torch", "nccl", "driver", "efa_adapters")]
        cells.append("; ".join(r["problems"]) or "ok")
        lines.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    text = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *lines]]
    text += [f"link: {link}" for link in verdict["links"]]
    named = problems(verdict)
    text.append(f"preflight: {len(verdict['rows'])} node(s) in {verdict['seconds']:.0f} s; "
                + (f"{len(named)} named" if named else "no node stands apart")
                + f" (tolerance {verdict['tolerance']:.0%} below the median)")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    from bench.core import faults
    from bench.core.config import EXIT_CONFIG
    from bench.core.load_config import from_dict
    from bench.launchers import launcher_sections
    from bench.study.compose import compose, make_launcher
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        raw, _ = compose(args)
        if not raw.get("sweep_name"):
            raise ConfigError("choose a sweep with +sweep=NAME")
        cfg = from_dict(raw, launcher_sections())
        faults.rules()  # the test hook's, if any: a bad rule is one line before anything is written
        launcher = make_launcher(cfg)
        launcher.preflight()
        listed = cluster_nodes(cfg.preflight, launcher)  # before the sweep dir: none is one line
        sweep_dir = Path(cfg.results_root) / cfg.sweep_name
        with rundir.locked(sweep_dir):
            try:
                verdict = check(nodes_of(cfg, launcher.placement(cfg)), launcher, sweep_dir, listed=listed)
            finally:
                launcher.close()
    except (ConfigError, rundir.SweepDirBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("interrupted: every preflight job was cleaned up", file=sys.stderr)
        return 130
    print(format_verdict(verdict))
    return EXIT_REFUSED if problems(verdict) else 0


if __name__ == "__main__":
    sys.exit(main())
