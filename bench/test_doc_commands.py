"""Every command a user copies from the README or docs/ (the ```bash blocks) is run here, so none rots: a
launch as `--dry-run` into a scratch results root, the rest as written (placeholders filled in), in the
order the page gives them. The install and the test command are the ones `.ci/run` runs."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
PLACEHOLDERS = {  # what a page leaves to the user -> what the test gives
    "REGISTRY": "registry.example", "<registry>": "registry.example", "USD": "98.32",
    "path/to/Mistral-7B-v0.1/config.json": "bench/core/testdata/hf/mistral_7b_v0.1/config.json",
}
LAUNCHES = ("bench.sweep",)
CI_RUN = (ROOT / ".ci" / "run").read_text()


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(page: Path) -> list[str]:
    """The page's shell commands in order: a `&&` chain as its parts, comments dropped."""
    found = []
    for block in BLOCK.findall(page.read_text()):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                found += [part.strip() for part in line.split("&&")]
    return found


def argv(command: str, results: Path) -> list[str] | None:
    """How the test runs a command: None where .ci/run is the proof (the install, the test suite)."""
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    words = shlex.split(command)
    if words[0] == "pip" or words[:3] == ["python", "-m", "pytest"] and "not slow" in command:
        return None
    if words[0] == "bash" and words[1].startswith("scripts/"):
        return words
    if words[:2] == ["python", "-m"] and words[2] in LAUNCHES:
        words = [w for w in words if w != "--dry-run"] + ["--dry-run", f"results_root={results}"]
    if words[:3] == ["python", "-m", "analysis.report"]:
        words = [w.replace("results/", f"{results}/", 1) if w.startswith("results/") else w for w in words]
    if words[:3] == ["python", "-m", "bench.preflight"]:
        words = [*words, f"results_root={results}"]
    return [sys.executable, *words[1:]] if words[0] == "python" else words


def test_every_command_is_one_the_test_knows_how_to_run(tmp_path: Path) -> None:
    """No page holds a command this module would run wrongly: each is a launch, a report, a preflight, the
    Slurm test cluster's script, the GPU check or its tests, or what .ci/run proves."""
    known = ("bench.sweep", "analysis.report", "bench.preflight", "bench.gpucheck", "pytest")
    for page in doc_pages():
        for command in commands(page):
            run = argv(command, tmp_path)
            if run is None:
                assert (command.replace("pip install", "python -m pip install -q") in CI_RUN
                        or command in CI_RUN), f"{page.name}: {command!r} is not what .ci/run runs"
                continue
            assert run[0] == "bash" or any(k in run for k in known), f"{page.name}: {command!r}"
            if any(k in run for k in LAUNCHES):
                assert run[-2:] == ["--dry-run", f"results_root={tmp_path}"]


RAN: set[tuple[str, ...]] = set()  # the bench commands that exited 0 this session, as run


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results root for every page, so a command two pages give (a plan, the preflight) runs once and
    a page's report finds the study another page planned."""
    return tmp_path_factory.mktemp("doc-results")


@pytest.mark.slow
@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.name)
def test_the_pages_commands_run(page: Path, results: Path, request: pytest.FixtureRequest) -> None:
    """Each command of the page, in order, exits 0 (a launch planned as a dry run; the Slurm test cluster's
    `stop` last). A page with a Slurm command runs against the local test cluster, which it leaves up for
    the tests after it. A `python -m bench.*` command that already exited 0 here is not run again."""
    runs = [(c, argv(c, results)) for c in commands(page)]
    runs = [(c, a) for c, a in runs if a is not None]
    # the cluster's `stop` is what a user runs when done: last, after every command the page names for it
    runs.sort(key=lambda run: run[0].endswith("slurm_cluster.sh stop"))
    if not runs:
        pytest.skip(f"{page.name} holds no command to run")
    env = dict(os.environ)
    if any("slurm" in c for c, _ in runs):
        env["SLURM_CONF"] = request.getfixturevalue("slurm_cluster")
    try:
        for command, run in runs:
            if tuple(run) in RAN:
                continue
            proc = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, \
                f"{page.name}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            if run[:2] == [sys.executable, "-m"] and run[2].startswith("bench."):
                RAN.add(tuple(run))
    finally:
        if any(c.endswith("slurm_cluster.sh stop") for c, _ in runs):
            subprocess.run(["bash", "scripts/slurm_cluster.sh", "start"], cwd=ROOT, capture_output=True,
                           timeout=180)
