"""The report's first screen, "The answer": the sentences a reader pastes, in the order a team sizing a
run reads them (where a study spans systems; per strong-scaling configuration the node count to rent, in
days and dollars; per model its best configuration's efficiency; what each MFU was divided by; per model
the loss at its largest node count and the change the model predicts wins it back), and the MFU's
denominator named beside every MFU. The per-configuration sentences of where the points went are the
split's own section's (analysis/report.py)."""
from __future__ import annotations

import pandas as pd

from analysis.scaling import CONFIG, configuration_label
from analysis.winback import Verdict, sentence
from bench.core.hardware import compute_dtype, gpu_spec


def peak_label(peak: float, device: object, precision: str) -> str:
    """"989.4 dense bf16 (H100-SXM)": the TFLOPS an MFU was divided by, its dtype and the GPU's table row."""
    spec = gpu_spec(str(device)) if isinstance(device, str) else None
    return f"{float(peak):g} dense {compute_dtype(precision)}" + (f" ({spec.name})" if spec else "")


def with_mfu_peak(agg: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """Each configuration and node count's MFU denominator as the page names it beside the figure: the
    peak its ok runs divided by (peak_tflops_per_gpu), "989.4 dense bf16 (H100-SXM)"; None on a CPU."""
    keys = [*CONFIG, "nodes"]
    ok = (frame["kind"] == "train") & (frame["status"] == "ok")
    runs = frame[ok & frame["peak_tflops_per_gpu"].notna()]
    if runs.empty or agg.empty:
        return agg.assign(mfu_peak=None)
    labels = runs.assign(mfu_peak=[peak_label(p, d, q) for p, d, q in zip(
        runs["peak_tflops_per_gpu"], runs["device_name"], runs["precision"])])
    peaks = labels.groupby(keys, dropna=False)["mfu_peak"].agg(lambda s: ", ".join(sorted(set(s))))
    peaks = peaks.reset_index()
    return agg.drop(columns="mfu_peak", errors="ignore").merge(peaks, on=keys, how="left")


def best_peak(best: pd.DataFrame, agg: pd.DataFrame) -> pd.DataFrame:
    """The headline rows with their MFU's denominator (headline() keeps a few columns of agg)."""
    if best.empty or "mfu_peak" not in agg:
        return best
    peaks = agg.assign(configuration=agg.apply(configuration_label, axis=1) if len(agg) else None)
    peaks = peaks[["model", "configuration", "nodes", "mfu_peak"]].drop_duplicates(
        ["model", "configuration", "nodes"])
    return best.merge(peaks, on=["model", "configuration", "nodes"], how="left")


def mfu_sentence(frame: pd.DataFrame) -> list[str]:
    """On the first screen, beside the MFU it quotes: what every MFU of the study was divided by."""
    runs = frame[(frame["kind"] == "train") & (frame["status"] == "ok") & frame["mfu"].notna()
                 & frame["peak_tflops_per_gpu"].notna()]
    if runs.empty:
        return []
    peaks = sorted({peak_label(p, d, q) for p, d, q in zip(runs["peak_tflops_per_gpu"], runs["device_name"],
                                                            runs["precision"])})
    return [f"MFU is model TFLOPS/GPU over the GPU's dense peak (no 2:4 sparsity; bench/core/hardware.py): "
            f"{'; '.join(p.replace(' dense', ' TFLOPS') for p in peaks)}"]


def change_sentences(best: pd.DataFrame, verdicts: list[Verdict]) -> list[str]:
    """One per model: the loss of the configuration the answer chose (the headline's, `best`) at its
    largest node count and the change predicted to win it back; a model whose chosen configuration was
    not traced at two node counts, its most-lost configuration's."""
    out = []
    chosen = set(zip(best["model"], best["configuration"])) if len(best) else set()
    for model in sorted({v.model for v in verdicts}):
        mine = [v for v in verdicts if v.model == model]
        named = [v for v in mine if (v.model, v.configuration) in chosen]
        out.append(sentence(max(named or mine, key=lambda v: (v.nodes, v.lost))))
    return out


def answer_sentences(spanning: list[str], knees: list[str], headlines: list[str], frame: pd.DataFrame,
                     probes: list[str], best: pd.DataFrame, verdicts: list[Verdict]) -> list[str]:
    """The first screen's sentences in their order; a probe-only study's are what each EFA count gave."""
    sentences = spanning + knees + headlines + mfu_sentence(frame)
    return (sentences or probes) + change_sentences(best, verdicts)
