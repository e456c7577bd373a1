"""benchmarks/nccl_model.py reads a published-table directory (index.yaml and one nccl-tests output per id),
predicts every row and prints per-row errors, per-table and overall medians split at 1 MiB and the held-out
tables apart; a directory it cannot read stops it in one line (exit 2). benchmarks/nccl_transports.py fits
each transport's figures on the same tables. The tables here are two shared samples (sample_02.txt,
sample_03.txt) laid out as the published directory will be."""
from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

ENTRIES = [
    {"id": "p4de_2n_allreduce", "source": "aws-samples/awsome-distributed-training",
     "collective": "all_reduce", "nodes": 2, "gpus_per_node": 8, "gpu": "A100-SXM4-80GB",
     "system": "p4de.24xlarge",
     "scale_up": {"kind": "nvswitch", "nvlink_gbs_per_gpu": 300},
     "scale_out": {"transport": "efa", "adapters": 4, "gbps": 100}, "nccl_version": None, "env": {},
     "notes": "shared sample_02.txt"},
    {"id": "p5_2n_allreduce_ring", "source": "aws-samples/awsome-distributed-training",
     "collective": "all_reduce", "nodes": 2, "gpus_per_node": 8, "gpu": "H100", "system": "p5.48xlarge",
     "scale_up": {"kind": "nvswitch", "nvlink_gbs_per_gpu": 450},
     "scale_out": {"transport": "efa", "adapters": 32, "gbps": 100}, "nccl_version": "2.21.5",
     "env": {"NCCL_ALGO": "Ring"}, "notes": "shared sample_03.txt, modelled as if run with NCCL_ALGO=Ring"},
]


@pytest.fixture
def tables(tmp_path: Path, shared_data: Path) -> Path:
    for entry, sample in zip(ENTRIES, ("sample_02.txt", "sample_03.txt"), strict=True):
        shutil.copy(shared_data / "nccl-tests" / sample, tmp_path / f"{entry['id']}.txt")
    (tmp_path / "index.yaml").write_text(yaml.safe_dump(ENTRIES))
    return tmp_path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/nccl_model.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_every_row_is_predicted_and_the_held_out_tables_are_reported_apart(tables: Path) -> None:
    split = tables / "split.txt"
    split.write_text("p5_2n_allreduce_ring  # held out\n")
    proc = run("--tables", str(tables), "--split", str(split))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    rows = re.findall(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+([+-][\d.]+)%\s+(\w+)/(\w+)$", out, re.M)
    assert len(rows) == 29 + 32  # every out-of-place row of both tables
    assert {algo for _, _, algo, _ in rows[29:]} == {"ring"}  # NCCL_ALGO=Ring from the entry's env
    assert "[held out] p5_2n_allreduce_ring: all_reduce 2 x 8 H100 on p5.48xlarge, NCCL 2.21.5" in out
    assert out.count("median |error|: >= 1 MiB") == 2
    held = re.search(r"^held out \(1 tables\) median \|error\|  >= 1 MiB:\s+([\d.]+)% of (\d+) rows", out,
                     re.M)
    rest = re.search(r"^the rest \(1 tables\) .* < 1 MiB:\s+([\d.]+)% of (\d+) rows", out, re.M)
    assert held and rest and int(held.group(2)) == 15 and int(rest.group(2)) == 17
    quick = run("--tables", str(tables), "--quick")
    assert quick.returncode == 0 and "NCCL pick" not in quick.stdout and "all (2 tables)" in quick.stdout


def test_unreadable_tables_stop_in_one_line(tables: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, message in (((str(empty),), "no index"),
                          ((str(tables), "--split", str(tables / "nothere")), "no such split file")):
        proc = run("--tables", *args)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
    (tables / "p4de_2n_allreduce.txt").unlink()
    proc = run("--tables", str(tables))
    assert proc.returncode == 2 and "p4de_2n_allreduce.txt: missing" in proc.stderr



PUBLISHED = ROOT / "benchmarks" / "published" / "nccl-tests"


def test_check_reads_every_published_table_and_predicts_nothing() -> None:
    proc = run("--check")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    ids = sorted(p.stem for p in PUBLISHED.glob("*.txt") if not p.name.startswith("holdout"))
    assert sorted(line.split(":")[0] for line in lines[:-1]) == ids
    summary = re.fullmatch(r"(\d+) entries: (\d+) modelled, (\d+) not modelled, 0 problems", lines[-1])
    assert summary and int(summary[1]) == len(ids) == int(summary[2]) + int(summary[3])
    held_out = {line.split("#")[0].strip() for line in (PUBLISHED / "holdout.txt").read_text().splitlines()}
    assert len(held_out - {""}) == 23 and held_out - {""} <= set(ids)
    # Slingshot through aws-ofi-nccl (RDMA), the entry's own CPU, the 4 NICs its source lists
    assert ("nersc_perlmutter_2n_allreduce_slingshot: all_reduce 2 x 4 A100-SXM4-40GB on NERSC Perlmutter "
            "GPU node (amd CPU, PCIe Gen4), NCCL 2.21.5; 4 GPU/node, nvlink 300 GB/s/GPU; "
            "slingshot 4 x 200 Gb/s RDMA (100 GB/s/node, NIC path phb); 30 rows; modelled") in lines
    # a published system (FABRICS) supplies what the entry leaves out: p4de's Intel CPU and PCIe Gen4
    assert ("shared_sample_02: all_reduce 2 x 8 A100-SXM4-80GB on p4de.24xlarge (intel CPU, PCIe Gen4), "
            "NCCL ?; 8 GPU/node, nvswitch 300 GB/s/GPU; efa 4 x 100 Gb/s RDMA (50 GB/s/node); 29 rows; "
            "modelled") in lines
    assert any(line.startswith("shared_sample_10: ") and "(6 with #wrong > 0)" in line for line in lines)
    assert "median |error|" not in proc.stdout and "NCCL pick" not in proc.stdout


def test_check_names_every_entry_it_cannot_read(tables: Path) -> None:
    entries = yaml.safe_load((tables / "index.yaml").read_text())
    p4de = entries[0]
    nvls_only = dict(p4de, id="p4de_nvls_forced", env={"NCCL_ALGO": "NVLS"})  # no NVLS on A100, none across
    unknown_gpu = dict(entries[1], gpu="MI300X")
    why_missing = dict(p4de, id="p4de_skipped", modelled=False)
    skipped = dict(p4de, id="p4de_not_modelled", modelled=False, why_not="no fabric: nodes unknown")
    for name in (nvls_only["id"], why_missing["id"], skipped["id"], "stray"):
        shutil.copy(tables / "p4de_2n_allreduce.txt", tables / f"{name}.txt")
    index = [p4de, unknown_gpu, nvls_only, why_missing, skipped, dict(p4de, id="gone")]
    (tables / "index.yaml").write_text(yaml.safe_dump(index))
    proc = run("--check", "--tables", str(tables))
    assert proc.returncode == 2
    problems = proc.stderr.splitlines()
    assert len(problems) == 5 and all(line.startswith("nccl_model: ") for line in problems)
    for expected in ("stray.txt: no index entry", "p5_2n_allreduce_ring: cannot be read: unknown GPU",
                     "p4de_nvls_forced: cannot be read: index entry p4de_nvls_forced: its env",
                     "p4de_skipped: cannot be read: index entry p4de_skipped: modelled: false needs",
                     "gone.txt: missing"):
        assert sum(expected in line for line in problems) == 1, expected
    out = proc.stdout.splitlines()
    assert ("p4de_not_modelled: all_reduce 2 x 8 A100-SXM4-80GB; 29 rows; not modelled: no fabric: nodes "
            "unknown") in out
    assert out[-1] == "6 entries: 1 modelled, 1 not modelled, 5 problems"
    (tables / "index.yaml").write_text(yaml.safe_dump([p4de, skipped]))
    quick = run("--tables", str(tables), "--quick")
    assert quick.returncode == 0, quick.stderr
    assert quick.stdout.startswith("[not modelled] p4de_not_modelled: no fabric: nodes unknown\n")
    assert "all (1 tables)" in quick.stdout


def test_staged_calibrates_on_the_smallest_node_count_and_predicts_the_larger(tmp_path: Path) -> None:
    """As a study's probe at 2 nodes would: CSCS Alps' 2-node all-reduce calibrates NCCL's model, and the same
    configuration's 4-node table is predicted with it; a table run with another environment is another
    configuration, neither calibrated on nor predicted."""
    published = ROOT / "benchmarks" / "published" / "nccl-tests"
    index = {e["id"]: e for e in yaml.safe_load((published / "index.yaml").read_text())}
    two, four = "cscs_alps_gh200_2n_allreduce_ofi1130", "cscs_alps_gh200_4n_allreduce_ofi1130"
    other = dict(index[four], id="cscs_alps_gh200_8n_allreduce_ofi1130", nodes=8,
                 env={**index[four]["env"], "NCCL_ALGO": "Ring"})
    for name in (two, four):
        shutil.copy(published / f"{name}.txt", tmp_path / f"{name}.txt")
    shutil.copy(published / f"{four}.txt", tmp_path / f"{other['id']}.txt")
    (tmp_path / "index.yaml").write_text(yaml.safe_dump([index[two], index[four], other]))
    proc = run("--tables", str(tmp_path), "--staged")
    assert proc.returncode == 0, proc.stderr
    found = re.findall(r"^(\w+): .*\n  calibrated on (\w+) \((\d+) nodes\): median \|error\| "
                       r">= 1 MiB\s+([\d.]+)% \(prior\s+([\d.]+)%\)", proc.stdout, re.M)
    assert [(t, base, int(n)) for t, base, n, _, _ in found] == [(four, two, 2)]
    calibrated, prior = (float(x) for x in found[0][3:])
    assert calibrated < 10 and 2 * calibrated < prior  # 7.6% calibrated, the transport's prior 21.1%
    assert "calibrated on the smallest node count (1 tables)" in proc.stdout


def test_cross_validation_fits_each_cluster_on_the_others_only(tables: Path) -> None:
    """Two EFA clusters (p4de, p5): each table is predicted by the figures fitted to the other's, so each
    procedure that fits does worse there than fitted to the table itself; NCCL's constants fit nothing. The
    command prints what the functions give."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import nccl_transports as nt
    entries = nt.read_index(tables)
    by = nt.fitted_tables(tables, entries)["efa"]
    assert sorted(t.system for t in by) == ["p4de.24xlarge", "p5.48xlarge"]
    cv = nt.cross_validate(tables, entries)["efa"]
    for procedure in ("hop", "both"):
        own = statistics.mean(nt.loss(t, nt.best([t], procedure)) for t in by)
        assert cv[procedure] > own + 0.01
    assert cv["nccl"] == pytest.approx(statistics.mean(nt.loss(t, None) for t in by))
    proc = run_transports("--cv", "--tables", str(tables))
    assert proc.returncode == 0, proc.stderr
    pick = min(cv, key=cv.__getitem__)
    assert proc.stdout.strip() == ("efa: loss on clusters left out, " + ", ".join(
        f"{p} {v:.3f}" for p, v in cv.items()) + f"; least: {pick}")
    cal, n = nt.fit(tables, entries)["efa"]
    proc = run_transports("--fit", "--tables", str(tables))
    assert proc.stdout.strip() == f"efa: {n} tables, hop latency {cal.net_latency_us:g} us, bandwidth x " \
                                  f"{cal.net_bw:g}" and n == 2
    assert run_transports("--tables", str(tables)).returncode == 2  # --fit or --cv: one of them


def run_transports(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/nccl_transports.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_shipped_transport_figures_are_what_the_fit_prints() -> None:
    """network.DEFAULTS for the transports the fit sets (the others keep the first fit's: its comment says
    why) are `nccl_transports.py --fit` over every published table."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import nccl_transports as nt

    from bench.predict.network import DEFAULTS
    fitted = nt.fit(nt.DEFAULT_TABLES, [e for e in nt.read_index(nt.DEFAULT_TABLES) if nt.modelled(e)])
    for transport in ("efa", "infiniband", "slingshot", "tcpxo"):
        cal, n = fitted[transport]
        shipped = DEFAULTS[transport]
        assert (shipped.net_latency_us, shipped.net_bw) == (cal.net_latency_us, cal.net_bw), transport
        assert f"fitted to {n} published {transport} tables" in shipped.source
