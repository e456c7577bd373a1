"""A run's metric records, and those of collective probes (all-reduce, all-gather, reduce-scatter): from
nccl-tests output (text or -J JSON) or the torch probe, with the transport NCCL really used checked against
the run's EFA setting."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.core import rundir
from bench.core.schema import RunSpec
from bench.probes.command import expected_network
from bench.probes.parse import NO_OUTPUT, parse, parse_all, parse_json
from bench.probes.result import NcclResult

JSON_FILE = "nccl-tests.json"  # where launchers point the nccl-tests binary's -J, inside the run dir

_STATUS = {"ok": "ok", "wrong_results": "failed", "truncated": "failed", "failed": "failed"}


def _summary(result: NcclResult, spec: RunSpec) -> dict[str, Any]:
    status = _STATUS[result.status]
    error = None
    if result.status == "wrong_results":
        error = f"nccl-tests reported wrong results ({result.wrong_total:g} wrong elements)"
    elif result.status == "truncated":
        error = "nccl-tests table ends early (crash, kill or excerpt): no matching Avg bus bandwidth line"
    elif result.status == "failed":
        error = result.errors[-1] if result.errors else "no nccl-tests results table"
        if any("NCCL" in e for e in result.errors):
            status = "nccl_error"
    rows = result.rows
    return {"kind": "summary", "status": status, "error": error, "source": "nccl-tests",
            "nccl_status": result.status, "ranks": result.inferred_ranks(), "nics": result.nics,
            "network_measurement": result.network_measurement, "groups": result.groups,
            "nccl_tests_version": result.tests_version, "collective": spec.collective,
            "busbw_avg_gbs": result.avg_busbw_printed if result.avg_busbw_printed is not None
            else result.avg_busbw, "busbw_max_gbs": result.busbw_max, "algbw_max_gbs": result.algbw_max,
            "transport": result.network, "transport_evidence": result.transport_evidence,
            "sizes": [{k: getattr(r, k) for k in ("size", "placement", "time_us", "algbw", "busbw", "wrong")}
                      for r in rows], "nccl_version": result.nccl_version,
            "no_output": result.errors == [NO_OUTPUT] and not rows}  # nothing printed: no evidence itself


def of_collective(text: str, collective: str) -> NcclResult:
    """The (last) run of `collective` in a probe's text; a run whose collective the text does not tell
    counts as the probe's own. A text holding only other collectives gives a failed result naming them."""
    results = parse_all(text)
    mine = [r for r in results if r.collective in (collective, None)]
    if mine or not results:
        return mine[-1] if mine else parse(text)
    held = sorted({str(r.collective) for r in results})
    return NcclResult(errors=[f"the output holds {', '.join(held)} results, not {collective}"])


def records_from_output(text: str, spec: RunSpec, json_text: str | None = None) -> list[dict[str, Any]]:
    """Records (one per size and placement, then a summary) of the probe's collective from its output."""
    result = parse_json(json_text) if json_text else of_collective(text, spec.collective)
    if json_text:  # the JSON has no NCCL INFO lines: take the transport from the text log
        text_result = parse(text)
        result.network, result.transport_evidence = text_result.network, text_result.transport_evidence
    rows = [{"kind": "nccl", **r._asdict()} for r in result.rows]
    return rows + [_summary(result, spec)]


def records_from_logs(run_dir: Path, spec: RunSpec) -> list[dict[str, Any]]:
    """Records of an nccl-tests run from its collected logs (and its -J JSON when it wrote one)."""
    text = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*.log")))
    json_path = run_dir / JSON_FILE
    return records_from_output(text, spec, json_path.read_text() if json_path.is_file() else None)


def check_transport(summary: dict[str, Any], spec: RunSpec, log_text: str) -> dict[str, Any]:
    """Fill the transport NCCL reported and fail an EFA run that did not use EFA.

    Runs on gloo (CPU) have no NCCL network; they keep their backend name as transport.
    """
    if summary.get("transport") in (None, ""):
        networks = [r.network for r in parse_all(log_text) if r.network]
        if networks:
            summary = {**summary, "transport": networks[-1]}
    network = summary.get("transport")
    if network in (None, "gloo") or summary.get("status") != "ok":
        return summary
    want = expected_network(spec.efa_per_node)
    if want.lower() not in str(network).lower():
        return {**summary, "status": "nccl_error",
                "error": f"expected NCCL network {want!r} for {spec.efa_per_node} EFA/node, got {network!r}"}
    nics = summary.get("nics")
    # the row would be mislabelled
    if spec.efa_per_node > 0 and nics is not None and nics != spec.efa_per_node:
        return {**summary, "status": "nccl_error",
                "error": f"NCCL found {nics} NICs per rank ('found {nics} nics'), the run asked for "
                         f"{spec.efa_per_node} EFA per node: its bandwidth is not the "
                         f"{spec.efa_per_node}-EFA figure"}
    return summary


def run_records(run_dir: Path, spec: RunSpec) -> list[dict[str, Any]]:
    """The run's metric records; of an all-reduce probe that wrote none (the nccl-tests binary), those
    parsed from its output."""
    records = rundir.read_records(run_dir)
    if spec.kind == "nccl" and not any(r["kind"] == "summary" for r in records):
        records += records_from_logs(run_dir, spec)
    return records
