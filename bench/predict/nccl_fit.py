"""NCCL's model (bench/predict/collective.py) fitted to measured nccl-tests rows: a study's own probes
(bench/predict/network.py calibrates each probe's fabric with `calibrate`) or published tables
(benchmarks/nccl_transports.py --fit, the transports' figures in network.DEFAULTS). Each row is priced once as
NCCL's model prices it (`priced`: NCCL's pick does not depend on the calibration), then the two figures a
table can read, a latency and a bandwidth scale, are each read from the rows that figure decides
(`fit_scales`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from bench.core.fabric import Fabric
from bench.predict.collective import Calibration, build_comm, latency_parts, predict_collective


def priced(kind: str, rows: Sequence[tuple[int, float]], nodes: int, gpus_per_node: int, fabric: Fabric, *,
           version: str | None = None, env: Mapping[str, str] | None = None
           ) -> list[tuple[int, float, float, float, float]]:
    """Measured rows of (bytes, time in us) as NCCL's model prices them without a calibration: (bytes, base
    latency us, us per us of network hop latency, bandwidth term us, measured us), rows with no size or time
    left out. NCCL's pick does not depend on a calibration, so a fit prices each row once."""
    comm = build_comm(kind, nodes, gpus_per_node, fabric, version)
    out = []
    for nbytes, time_us in rows:
        if nbytes <= 0 or time_us <= 0:
            continue
        t = predict_collective(kind, nbytes, nodes, gpus_per_node, fabric, version=version, env=env)
        pick = next(c for c in t.candidates if (c.algorithm, c.protocol) == (t.algorithm, t.protocol))
        base, per_hop = latency_parts(comm, pick, nbytes)
        out.append((nbytes, base, per_hop, t.bandwidth_s * 1e6, time_us))
    return out


def calibrate(kind: str, rows: Sequence[tuple[int, float]], nodes: int, gpus_per_node: int, fabric: Fabric, *,
              version: str | None = None, env: Mapping[str, str] | None = None) -> Calibration:
    """A fabric's effective figures from one measured nccl-tests table at one shape: rows of (bytes, time
    in us). Two figures, each read where it decides the time (fit_scales): across nodes the latency of one
    network hop and the bandwidth efficiency of a multi-node collective; on one node the latency scale and
    the bandwidth efficiency of the scale-up domain. NCCL's pick stays its own; other sizes and node counts
    are predicted by the model with these figures, never read off a row."""
    terms = [t[1:] for t in priced(kind, rows, nodes, gpus_per_node, fabric, version=version, env=env)]
    if len(terms) < 2:
        raise ValueError("calibrate needs at least two rows with a size and a time")
    out = fabric.scale_out
    where = f"calibrated on a {nodes} x {gpus_per_node} {kind} table of {len(terms)} rows"
    if nodes > 1 and out is not None:
        hop, bw = fit_scales(terms, out.latency_us, network=True)
        return Calibration(net_latency_us=hop, net_bw=bw, source=where)
    lat, bw = fit_scales(terms, 0.0, network=False)
    return Calibration(latency=lat, intra_bw=bw, source=where)


DOMINANT = 4.0  # a row reads a figure where the model's term for it is at least 4x the other (80% of time)


def fit_scales(terms: Sequence[tuple[float, float, float, float]], hop: float,
               network: bool) -> tuple[float, float]:
    """From rows of (base latency L0, latency per us of network hop K, bandwidth term B, measured t), us:
    the bandwidth scale b = median of B / (t - latency) over the rows the bandwidth term dominates; the
    latency figure over the rows the latency term dominates: across nodes the hop latency h = median of
    (t - B / b - L0) / K (at least 0), on one node the scale a = median of (t - B / b) / L0; three rounds.
    A figure no row is dominated by keeps NCCL's. Medians, so that one noisy row moves neither."""
    def latency(l0: float, k: float, a: float, h: float) -> float:
        return a * l0 + k * h

    lat_rows = [r for r in terms if latency(r[0], r[1], 1.0, hop) >= DOMINANT * r[2]]
    bw_rows = [r for r in terms if r[2] >= DOMINANT * latency(r[0], r[1], 1.0, hop)]
    a, h, b = 1.0, hop, 1.0
    for _ in range(3):
        if bw_rows:
            b = _median([bw / max(t - latency(l0, k, a, h), 0.05 * t) for l0, k, bw, t in bw_rows])
        if lat_rows and network:
            h = max(0.0, _median([(t - bw / b - l0) / k for l0, k, bw, t in lat_rows if k > 0] or [h]))
        elif lat_rows:
            a = _median([max(t - bw / b, 0.05 * t) / l0 for l0, k, bw, t in lat_rows])
    return (h if network else a), b


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
