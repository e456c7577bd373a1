"""The performance model (bench/predict/perf.py) against every published row it used: fits its calibrated
constants to bench/predict/published.py's CALIBRATION_ROWS, prints each row's prediction and error with its
source, and the same for CHECK_ROWS (llm-foundry's whole table and torchtitan's Float8 rows, never fitted to),
with llm-foundry's table summarised by section, stack, model and sequence length and its small models' scaling
efficiency; and this project's own GPU runs (benchmarks/evidence/*/, bench.gpucheck's results tables), never
fitted to. Then the model's split of the step against the measured one, part by part
(benchmarks/split_model.py): over the recorded GPU runs with a trace, and over each study's runs (a smoke
sweep dir, `--study`), alone and pooled.

    python benchmarks/perf_model.py   # fit, compare with perf.py's CALIBRATION, print the tables
    python benchmarks/perf_model.py --quick   # one round of the refit
    python benchmarks/perf_model.py --study results/smoke   # and the split against that study's traces
    python benchmarks/perf_model.py --quick --study a/results/smoke --study b/results/smoke   # and pooled
    python benchmarks/perf_model.py --quick --cores 2 --cpu-isa "avx2 avx512f" --cpu-mhz 2600 --study ...

A CPU study's priors read the CPU its runs recorded (their system records: vector units, clock, usable
cores), else the reading machine's: `--cpu-isa`, `--cpu-mhz` and `--cores` give the machine that ran the
studies, for what their runs recorded none of (benchmarks/evidence/smoke_studies/README.md says which).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fsdp_rows  # noqa: E402
from split_model import part_summary, pooled, split_here, study_split  # noqa: E402

from bench.core.hardware import gpu_spec  # noqa: E402
from bench.gpucheck.evidence import EVIDENCE_DIR, table_runs  # noqa: E402
from bench.predict import perf  # noqa: E402
from bench.predict.calibrate import Observation, fit as fit_study  # noqa: E402
from bench.predict.cpu import CpuFacts, this_cpu  # noqa: E402
from bench.predict.network import one_node  # noqa: E402
from bench.predict.perf import CALIBRATION, Calibration, predict  # noqa: E402
from bench.predict.published import (  # noqa: E402
    CALIBRATION_ROWS,
    CHECK_ROWS,
    FOUNDRY_2023,
    FoundryRow,
    PublishedRow,
    foundry_table,
)
from bench.predict.split import PARTS as TRACE_PARTS  # noqa: E402

# The fitted constants. Contention is not among them: it stays at its measured figure (perf.CALIBRATION's
# comment); with the others fitted, the loss over these rows is lowest near it (benchmarks/evidence/README.md,
# "Published FSDP rows")
NAMES = ("A100", "H100", "elementwise_bytes", "compile_traffic")
BOUNDS = ((0.3, 0.98), (0.3, 0.98), (0.0, 2000.0), (0.1, 1.0))


def calibration(x: tuple[float, ...]) -> Calibration:
    return Calibration({"A100": x[0], "H100": x[1]}, x[2], CALIBRATION.contention, x[3])


def _tokens(row: PublishedRow, cal: Calibration, nodes: int | None = None) -> float:
    spec = row.spec if nodes is None else row.spec.at_nodes(nodes)
    return predict(spec, row.gpu, row.network, row.arch, cal, row.stack).tokens_per_s_per_gpu


def error(row: PublishedRow, cal: Calibration) -> float:
    """Relative error of the row's published figure: tokens/s/GPU, or scaling efficiency."""
    if row.tokens_per_s_per_gpu is not None:
        return _tokens(row, cal) / row.tokens_per_s_per_gpu - 1
    return _tokens(row, cal) / _tokens(row, cal, row.base_nodes) / row.scaling_efficiency - 1


EFFICIENCY_WEIGHT = 3.0  # AWS's 87% on p5 is the only EFA row: it must not be outvoted by 24 RDMA rows


def fitted_rows() -> list[PublishedRow]:
    """What the constants are fitted to: CALIBRATION_ROWS and the published FSDP rows not set aside
    (benchmarks/published/fsdp/holdout.txt) that CALIBRATION_ROWS does not hold already, of this harness's
    own stack (a row read with another, llm-foundry's, checks the model as CHECK_ROWS do)."""
    rows, held = fsdp_rows.modelled(fsdp_rows.fsdp_rows()), fsdp_rows.held_out()
    extra = [r.published_row for r in rows if r.id not in held and not r.already_used and r.perf_stack is None
             and (r.tokens_per_s_per_gpu or r.scaling_efficiency) and r.confidence != "low"
             and r.gpu is not None and r.gpu.family in OWN_FAMILY.get(r.gpu.name, (r.gpu.family,))]
    return CALIBRATION_ROWS + extra


# A row informs the calibration of its own GPU only: a GPU that borrows another family's figures (B200
# H100's, A10G and L4 A100's: bench/core/hardware.py) is predicted, never fitted to
OWN_FAMILY = {"B200": (), "A10G": (), "L4": ()}


FITTED = fitted_rows()


def loss(x: tuple[float, ...]) -> float:
    cal = calibration(x)
    return sum((EFFICIENCY_WEIGHT if r.scaling_efficiency else 1.0) * math.log1p(error(r, cal)) ** 2
               for r in FITTED)


def fit(x: list[float], rounds: int = 12) -> list[float]:
    """Coordinate descent: a golden-section search along each constant in turn (the loss is smooth and the
    constants nearly separable; no dependency beyond the project's)."""
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(rounds):
        for i, (low, high) in enumerate(BOUNDS):
            def at(v: float, i: int = i) -> float:  # the loss with constant i at v, the others as they are
                return loss(tuple(x[:i] + [v] + x[i + 1:]))

            a, b = low, high
            c, d = b - golden * (b - a), a + golden * (b - a)
            fc, fd = at(c), at(d)
            for _ in range(40):  # each step keeps one point of the last and evaluates one
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - golden * (b - a)
                    fc = at(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + golden * (b - a)
                    fd = at(d)
            x[i] = (a + b) / 2
    return x


def table(rows: list[PublishedRow], cal: Calibration) -> list[float]:
    errors = []
    for row in rows:
        e = error(row, cal)
        errors.append(e)
        what = (f"{row.tokens_per_s_per_gpu:,.0f} tok/s/GPU" if row.tokens_per_s_per_gpu is not None
                else f"efficiency {row.scaling_efficiency:.0%} vs {row.base_nodes} node")
        got = (f"{_tokens(row, cal):,.0f}" if row.tokens_per_s_per_gpu is not None
               else f"{_tokens(row, cal) / _tokens(row, cal, row.base_nodes):.0%}")
        print(f"  {row.label:<86} published {what:<28} predicted {got:>7}  {e:+6.1%}  [{row.source[:48]}]")
    return errors


def efficiency_pairs(rows: list[PublishedRow], cal: Calibration) -> list[float]:
    """Scaling efficiency errors where a source published the same configuration at two node counts."""
    errors = []
    for small in rows:
        for large in rows:
            same = (small.source == large.source and small.arch == large.arch and small.gpu == large.gpu
                    and small.spec.at_nodes(large.spec.nodes) == large.spec)
            if same and small.spec.nodes < large.spec.nodes and small.tokens_per_s_per_gpu:
                published = large.tokens_per_s_per_gpu / small.tokens_per_s_per_gpu
                predicted = _tokens(large, cal) / _tokens(small, cal)
                errors.append(predicted / published - 1)
                print(f"  {large.label:<86} efficiency {small.spec.nodes}->{large.spec.nodes} nodes: "
                      f"published {published:.1%}, predicted {predicted:.1%} ({errors[-1]:+.1%})")
    return errors


def staged(rows: list[PublishedRow], cal: Calibration) -> tuple[list[float], list[float]]:
    """Each configuration a source published at two or more node counts, as a staged study sees it: its
    calibration (bench/predict/calibrate.py) fitted on the smallest node count's row alone, the largest
    node count predicted. Returns (calibrated, published-constants) errors of those largest rows."""
    groups: dict[tuple, list[PublishedRow]] = {}
    for row in rows:
        if row.tokens_per_s_per_gpu:
            key = (row.source, row.arch.name, row.gpu.name, row.spec.at_nodes(1))
            groups.setdefault(key, []).append(row)
    calibrated, published = [], []
    for group in groups.values():
        if len({r.spec.nodes for r in group}) < 2:
            continue
        small, large = min(group, key=lambda r: r.spec.nodes), max(group, key=lambda r: r.spec.nodes)
        seen = Observation(small.label, small.spec, small.gpu, small.network, small.arch,
                           small.tokens_per_s_per_gpu, small.stack)
        study = fit_study([seen], cal)
        assert study is not None
        calibrated.append(_tokens(large, study.calibration) / large.tokens_per_s_per_gpu - 1)
        published.append(error(large, cal))
        print(f"  {large.label:<86} from {small.spec.nodes} node(s): "
              f"published {large.tokens_per_s_per_gpu:,.0f}, calibrated {calibrated[-1]:+6.1%}, "
              f"published constants {published[-1]:+6.1%}  [{large.source[:40]}]")
    return calibrated, published


SMALL = ("mpt_125m", "mpt_350m", "mpt_760m", "mpt_1b", "mpt_3b")  # llm-foundry's models up to 3B


def grouped(keys: list, errors: list[float]) -> dict:
    """Errors grouped by their rows' keys, in first-seen order."""
    groups: dict = {}
    for key, e in zip(keys, errors, strict=True):
        groups.setdefault(key, []).append(e)
    return groups


def foundry(rows: list[FoundryRow]) -> tuple[list[float], list[float]]:
    """llm-foundry's whole table (216 rows, never fitted to): the median |error| per section, stack, model and
    sequence length, and the scaling efficiency of its small models at 16-64 nodes against the same
    configuration's smallest node count, in points. Returns (tokens/s/GPU errors in the table's order,
    efficiency errors in points)."""
    errors = [error(r.row, CALIBRATION) for r in rows]
    for key, label in ((lambda r: r.section, "section"), (lambda r: r.row.stack.name, "stack"),
                       (lambda r: r.row.arch.name, "model"),
                       (lambda r: f"{r.row.spec.seq_len:>5}", "sequence length")):
        groups = grouped([key(r) for r in rows], errors)
        for name, errs in sorted(groups.items()) if label == "sequence length" else groups.items():
            print(f"  {label + ' ' + name:<62} {len(errs):>3} rows, median |error| "
                  f"{statistics.median(map(abs, errs)):5.1%}, median {statistics.median(errs):+6.1%}")
    points = []
    by_config: dict[tuple, list[PublishedRow]] = {}
    for r in rows:
        if r.row.arch.name in SMALL:
            by_config.setdefault((r.section, r.row.arch.name, r.row.spec.at_nodes(1)), []).append(r.row)
    for group in by_config.values():
        base = min(group, key=lambda r: r.spec.nodes)
        for large in (r for r in group if 16 <= r.spec.nodes <= 64 and r.spec.nodes > base.spec.nodes):
            published = large.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu
            predicted = _tokens(large, CALIBRATION) / _tokens(base, CALIBRATION)
            points.append(100 * (predicted - published))
            print(f"  efficiency {large.label:<80} vs {base.spec.nodes:>2} node(s): "
                  f"published {published:6.1%}, predicted {predicted:6.1%} ({points[-1]:+.1f} points)")
    return errors, points


def by_seq_len(rows: list[PublishedRow], errors: list[float]) -> dict[int, float]:
    """The median error per sequence length."""
    groups = grouped([r.spec.seq_len for r in rows], errors)
    return {seq: statistics.median(errs) for seq, errs in sorted(groups.items())}


def kernel_sensitivity(rows: list[PublishedRow]) -> None:
    """llm-foundry's whole table with one of its FlashAttention-1 class kernel's figures at another point of
    what its sources allow: 25-40% of an A100's peak, FlashAttention-2 "around 2x" its speed on an H100."""
    cited = FOUNDRY_2023.attention
    moved = {"A100 at 25%": {"A100": 0.25}, "A100 at 40%": {"A100": 0.40},
             "H100 at FlashAttention-2's 35%": {"H100": 0.35}, "H100 at 35% / 1.5": {"H100": 0.35 / 1.5},
             "H100 at 35% / 2.5": {"H100": 0.35 / 2.5}}
    for label, figure in moved.items():
        stack = replace(FOUNDRY_2023, attention={**cited, **figure})
        errors = [error(replace(r, stack=stack) if r.stack == FOUNDRY_2023 else r, CALIBRATION) for r in rows]
        median = statistics.median(map(abs, errors))
        print(f"  FlashAttention-1 class kernel {label:<32} median |error| {median:5.1%}")


def _scatter(errors: list[float]) -> float:
    """The median distance of the log errors from their own median: how well a reading ranks the rows, with
    the stack's overall offset (the model's one figure for all of them) taken out."""
    logs = [math.log1p(e) for e in errors]
    centre = statistics.median(logs)
    return statistics.median(abs(x - centre) for x in logs)


def accumulation_sensitivity(rows: list[FoundryRow]) -> None:
    """llm-foundry's table read with its GradAccum (the optimizer once a step) and as one micro batch a step
    (once a micro batch, GradAccum ignored): both readings' median |error|, offset and scatter, the
    accumulating rows apart; then each stack's optimizer at the bytes its own code moves instead of fused
    AdamW's 28 (perf.OPTIMIZER_BYTES): Composer's DecoupledAdamW and clipping on this table, this harness's
    foreach AdamW on its own GPU runs."""
    readings = {"with GradAccum": [r.row for r in rows],
                "one micro batch a step": [one_micro_batch(r.row) for r in rows]}
    for label, published in readings.items():
        errors = [error(row, CALIBRATION) for row in published]
        accumulating = [e for e, r in zip(errors, rows, strict=True) if r.row.spec.grad_accum > 1]
        single = [e for e, r in zip(errors, rows, strict=True) if r.row.spec.grad_accum == 1]
        print(f"  {label:<24} median |error| {statistics.median(map(abs, errors)):5.2%}, median "
              f"{statistics.median(errors):+6.2%} (accumulating rows "
              f"{statistics.median(accumulating):+6.2%}, the rest {statistics.median(single):+6.2%}), "
              f"scatter about its median {_scatter(errors):5.2%}")
    with mock.patch.object(perf, "OPTIMIZER_BYTES", 92):
        errors = [error(r.row, CALIBRATION) for r in rows]
    print(f"  optimizer at 92 B/param (Composer's DecoupledAdamW + clipping): llm-foundry's table, "
          f"median |error| {statistics.median(map(abs, errors)):5.2%}")
    with mock.patch.object(perf, "OPTIMIZER_BYTES", 72), contextlib.redirect_stdout(io.StringIO()):
        errors = measured_here(CALIBRATION)
    print(f"  optimizer at 72 B/param (this harness's foreach AdamW): this project's GPU runs, "
          f"median |error| {statistics.median(map(abs, errors)):5.2%}")


def loss_sensitivity(rows: list[FoundryRow]) -> None:
    """The loss's traffic over the logits (traffic.loss_bytes), added after the table's small models were seen
    to miss most at short sequences: llm-foundry's table with its stack's figure at what each reading of its
    code allows (the fused loss alone; its train metrics without autocast's fp32 cast; as shipped), and
    with no loss term at all, beside this project's GPU runs; the shipped constants throughout (refitted
    with the term: its own fit would move them)."""
    def foundry(loss: float | None) -> list[float]:
        return [error(replace(r.row, stack=replace(r.row.stack, loss_bytes=loss)), CALIBRATION) for r in rows]
    for label, loss in (("the fused loss alone (no train metrics)", 6.0),
                        ("train metrics without autocast's fp32 cast", 14.0),
                        (f"as shipped ({FOUNDRY_2023.loss_bytes:g})", FOUNDRY_2023.loss_bytes)):
        print(f"  llm-foundry's loss at {loss:>4g} B a logit, {label:<44} median |error| "
              f"{statistics.median(map(abs, foundry(loss))):5.2%}")
    with mock.patch.object(perf, "loss_bytes", lambda *_: 0.0), contextlib.redirect_stdout(io.StringIO()):
        ours = measured_here(CALIBRATION)
        errors = foundry(0.0)
    print(f"  no loss term anywhere: llm-foundry's table, median |error| "
          f"{statistics.median(map(abs, errors)):5.2%}; this project's GPU runs "
          f"{statistics.median(map(abs, ours)):5.2%}")


def one_micro_batch(row: PublishedRow) -> PublishedRow:
    """A published row read as one micro batch a step, its GradAccum ignored: what a model that charges the
    optimizer once a micro batch would be fitted to."""
    return replace(row, spec=replace(row.spec, global_batch=0))


def measured_here(cal: Calibration) -> list[float]:
    """Every training run bench.gpucheck measured on a GPU for this project, predicted as a plan would
    before launch with these constants (one rank: no network), beside what it measured; a run whose
    prediction is a floor only (DeviceModel.unmodeled: CPU offload) is printed, not counted."""
    errors = []
    for csv_path in sorted(EVIDENCE_DIR.glob("*/*.csv")):
        for spec, row in table_runs(csv_path):
            if (gpu := gpu_spec(row["device_name"])) is None:
                continue
            prediction = predict(spec, gpu, one_node(gpu), cal=cal)
            measured = float(row["tokens_per_s_per_gpu"])
            error = prediction.tokens_per_s_per_gpu / measured - 1
            if prediction.unmodeled is None:
                errors.append(error)
            print(f"  {csv_path.parent.name[:28]:28} {spec.label[:64]:64} predicted "
                  f"{prediction.tokens_per_s_per_gpu:9,.0f} measured {measured:9,.0f} {error:+7.1%} "
                  f"{prediction.bound}" + (f" (a floor, not counted: {prediction.unmodeled})"
                                           if prediction.unmodeled else ""))
    return errors


def exposed_here(cal: Calibration) -> list[float]:
    """The model's exposed communication against what each recorded GPU run's own trace measured (the
    exposed parts of RunSummary.trace_split, scaled to the measured step): a run's results row has it where
    the run recorded a trace (trainer/trace.py); none is invented where it did not."""
    errors, untraced = [], 0
    for csv_path in sorted(EVIDENCE_DIR.glob("*/*.csv")):
        for spec, row in table_runs(csv_path):
            split = json.loads(row["trace_split"]) if row.get("trace_split") else None
            if (gpu := gpu_spec(row["device_name"])) is None or not split:
                untraced += 1
                continue
            parts = [v for k, v in split.items() if k.startswith("exposed_")]
            total = sum(v for k, v in split.items() if k in TRACE_PARTS)
            measured = sum(parts) * float(row["step_time_s"]) / total if total else 0.0
            predicted = predict(spec, gpu, one_node(gpu), cal=cal).exposed_s
            print(f"  {csv_path.parent.name[:28]:28} {spec.label[:64]:64} exposed comm. predicted "
                  f"{predicted * 1e3:8.2f} ms measured {measured * 1e3:8.2f} ms")
            if measured > 0:
                errors.append(predicted / measured - 1)
    if untraced:
        print(f"  {untraced} recorded GPU run(s) have no trace split: they ran before the worker recorded "
              "traces, or untraced (the gpucheck's memory and MFU steps), so their exposed communication "
              "was never measured")
    return errors


def summary(name: str, errors: list[float]) -> None:
    worst = max(errors, key=abs)
    print(f"{name}: {len(errors)} rows, median |error| {statistics.median(map(abs, errors)):.1%}, "
          f"worst {worst:+.1%}")


def given_cpu(argv: list[str]) -> CpuFacts:
    """The machine that ran the studies as the command line gives it (--cpu-isa, --cpu-mhz, --cores), each
    fact not given this machine's."""
    given = {flag: value for flag, value in zip(argv, argv[1:])}
    here = this_cpu()
    return CpuFacts(frozenset(given["--cpu-isa"].split()) if "--cpu-isa" in given else here.isa,
                    float(given["--cpu-mhz"]) if "--cpu-mhz" in given else here.mhz,
                    int(given["--cores"]) if "--cores" in given else here.cores)


def main() -> None:
    shipped = CALIBRATION
    start = [shipped.matmul_efficiency["A100"], shipped.matmul_efficiency["H100"], shipped.elementwise_bytes,
             shipped.compile_traffic]
    fitted = fit(list(start), rounds=1 if "--quick" in sys.argv[1:] else 12)
    print("constants   shipped (bench/predict/perf.py)   refitted here")
    for name, a, b in zip(NAMES, start, fitted):
        print(f"  {name:<18} {a:>10.3f}            {b:>10.3f}")
    print(f"loss: shipped {loss(tuple(start)):.4f}, refitted {loss(tuple(fitted)):.4f}\n")
    print("Calibration rows (fitted to), with the shipped constants:")
    calib = table(CALIBRATION_ROWS, shipped)
    print("\nCheck rows (never fitted to):")
    check = table(CHECK_ROWS, shipped)
    print("\nScaling efficiency where a source published two node counts (tokens/s/GPU ratio):")
    pairs = efficiency_pairs(CALIBRATION_ROWS + CHECK_ROWS, shipped)
    print("\nCalibrate on the smallest node count, predict the largest (a staged study on published rows):")
    stage_cal, stage_pub = staged(CALIBRATION_ROWS + CHECK_ROWS, shipped)
    print("\nllm-foundry's whole table (never fitted to), by section, stack, model and sequence length:")
    foundry_rows = foundry_table()
    whole, points = foundry(foundry_rows)
    print("\nThe same table, one kernel figure moved (its cited range's ends; the H100 halving changed):")
    kernel_sensitivity([r.row for r in foundry_rows])
    print("\nThe same table with and without its GradAccum, and each stack's optimizer as its code counts:")
    accumulation_sensitivity(foundry_rows)
    print("\nThe same table, the loss's traffic moved (shipped constants):")
    loss_sensitivity(foundry_rows)
    print("\nThis project's own GPU runs (benchmarks/evidence/, never fitted to):")
    ours = measured_here(shipped)
    print()
    summary("staged: calibrated on the smallest node count", stage_cal)
    summary("staged: the same rows with the published constants", stage_pub)
    summary("calibration, tokens/s/GPU and MFU (one ratio: MFU = tokens/s x FLOPs/token / peak)", calib)
    summary("check (held out), tokens/s/GPU and MFU", check)
    summary("scaling efficiency, published pairs and AWS's 87%", pairs + [calib[-1]])
    summary("llm-foundry's whole table, tokens/s/GPU", whole)
    summary("the same table read as one micro batch a step (GradAccum ignored, as before issue 46)",
            [error(one_micro_batch(r.row), CALIBRATION) for r in foundry_rows])
    summary("this project's GPU runs, tokens/s/GPU", ours)
    print("\nExposed communication, predicted vs each GPU run's trace (benchmarks/evidence/):")
    exposed = exposed_here(shipped)
    if exposed:
        summary("this project's GPU runs, exposed communication", exposed)
    else:
        print("exposed communication: no recorded GPU run measured any (the traced ones ran on one GPU, with "
              "no collective to expose); no error to give")
    print(f"llm-foundry's models up to 3B at 16-64 nodes: {len(points)} efficiencies, median |error| "
          f"{statistics.median(map(abs, points)):.1f} points, worst {max(points, key=abs):+.1f} points")
    print("\nThe model's split against the measured, each recorded GPU run's trace (published constants):")
    part_summary(split_here(shipped))
    studies = [Path(a) for flag, a in zip(sys.argv[1:], sys.argv[2:]) if flag == "--study"]
    print("\nThe model's split against the measured, a study calibrated on its smallest node count:")
    seen = [s for s in (study_split(study, given_cpu(sys.argv[1:])) for study in studies) if s is not None]
    if len(seen) > 1:
        pooled(seen)
    if not studies:
        print("no study given (--study results/smoke: a sweep dir whose runs recorded traces)")


if __name__ == "__main__":
    main()
