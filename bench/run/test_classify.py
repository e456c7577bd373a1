"""Failures as they really read on a cluster: texts from torch's and NCCL's own sources and published logs,
and torchrun's own summary of a killed rank, produced here by a real torchrun."""
from __future__ import annotations

import subprocess
import sys
import tempfile

from bench.launchers.base import Outcome
from bench.run.classify import classify

# A published multi-node log (torch 2.5, ProcessGroupNCCL.cpp:629), two ranks' lines as torch writes them.
WATCHDOG = (
    "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
    "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n"
    "[rank1]:[E1218 20:27:21.484903450 ProcessGroupNCCL.cpp:2168] [PG ID 1 PG GUID 1 Rank 1]  failure "
    "detected by watchdog at work sequence id: 1 PG status: last enqueued work: 547, last completed work: "
    "546\n")
# The desync report's three forms, in the words of torch's TraceUtils.h (retrieveDesyncReport: ranks that
# never joined; ranks that joined the lowest collective but did not finish it; ranks that finished it and
# never joined the next).
NEVER_JOINED = ("\n\t - To our best knowledge, ranks [5, 13] are the lagging ranks that caused this timeout. "
                "They never joined any collectives")
DID_NOT_FINISH = ("\n\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync "
                  "are:\n\t   - [47] joined but didn't finish collective #41207 (count from 1)")
# A report as a user posted it (NVIDIA/nccl issue, torch 2.x on two DGX Spark nodes): the watchdog on rank 0,
# and rank 1 done with #1155873 but never at #1155874, the all-reduce rank 0 waited in.
POSTED = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1155874, OpType=ALLREDUCE, "
          "NumelIn=9445376, NumelOut=9445376, Timeout(ms)=1800000) ran for 1800002 milliseconds before "
          "timing out.\n\n[1] finished collective #1155873, but didn't join collective #1155874\n")


def test_an_nccl_watchdog_timeout_names_the_collective_and_the_rank() -> None:
    status, error = classify(Outcome(returncodes=[1, 1]), [], "step 3\n" + WATCHDOG + "ChildFailedError\n")
    assert status == "nccl_error"
    assert error == "NCCL watchdog timeout: BROADCAST #1 did not finish on rank 0 within 600 s"


def test_the_desync_report_names_the_lagging_ranks() -> None:
    _, error = classify(Outcome(returncodes=[1]), [],
                        WATCHDOG.replace("timing out.", "timing out." + NEVER_JOINED))
    assert error.endswith("; desync report: ranks [5, 13] never joined any collective")
    _, error = classify(Outcome(returncodes=[1]), [],
                        WATCHDOG.replace("timing out.", "timing out." + DID_NOT_FINISH))
    assert error.endswith("; desync report: ranks [47] joined but did not finish collective #41207")
    status, error = classify(Outcome(returncodes=[1, 1]), [], POSTED)
    assert status == "nccl_error" and error == (
        "NCCL watchdog timeout: ALLREDUCE #1155874 did not finish on rank 0 within 1800 s; desync report: "
        "ranks [1] finished collective #1155873 but never joined #1155874, which the other ranks waited in")


def test_the_desync_report_leads_the_workers_own_error() -> None:
    """Rank 0 caught the watchdog's exception and wrote its summary: the text's lagging rank still comes
    first, as the flight recorder's verdict does (bench/run/collect.py)."""
    summary = {"status": "failed", "error": "DistBackendError: [Rank 0] Watchdog caught collective operation "
               "timeout: WorkNCCL(SeqNum=1155874, OpType=ALLREDUCE) ran for 1800002 milliseconds"}
    status, error = classify(Outcome(returncodes=[1, 1]), [summary], POSTED)
    assert status == "nccl_error"
    assert error.startswith("desync report: ranks [1] finished collective #1155873 but never joined #1155874")
    assert error.endswith(summary["error"])
    oom = {"status": "oom", "error": "OutOfMemoryError: CUDA out of memory"}  # not a desync: left as it is
    assert classify(Outcome(returncodes=[3]), [oom], POSTED) == ("oom", oom["error"])


def _torchrun_killed_rank() -> str:
    """torchrun's own ChildFailedError summary of a worker killed by SIGKILL (what the OOM killer does)."""
    with tempfile.TemporaryDirectory(prefix="fsdpbench-torchrun-") as logs:  # else torchrun's stay in /tmp
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", "--max-restarts=0", f"--log-dir={logs}", "--no-python",
                               sys.executable, "-c",
                               "import os, time\nif os.environ['RANK'] == '1': os.kill(os.getpid(), 9)\n"
                               "time.sleep(30)"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_a_rank_killed_by_sigkill_is_named_with_its_host() -> None:
    text = _torchrun_killed_rank()
    assert "exitcode  : -9" in text  # torchrun's real words
    status, error = classify(Outcome(returncodes=[1]), [], text)
    assert status == "failed"
    assert (error.startswith("rank 1 on ")
            and "killed by SIGKILL (exitcode -9): the host's OOM killer" in error)
    # With the kernel's own OOM line beside it, the status says so.
    status, _ = classify(Outcome(returncodes=[1]), [], "Out of memory: Killed process 4242 (python)\n" + text)
    assert status == "oom"
