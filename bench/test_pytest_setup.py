"""The default suite's own setup: pytest-xdist's --dist loadgroup (pyproject.toml addopts, conftest.py
pytest_collection_modifyitems) runs each test module, and the trainer's shared runs, on one worker, so a
module's fixtures (the memory reference, the trained series) are computed once, not on both workers."""
from __future__ import annotations

import pytest


def test_each_module_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    """pytest 9.2 with pytest-xdist 3.8 drops the groups without a word (pytest-dev/pytest-xdist#1386: 9.2's
    node ids no longer take xdist's group suffix) and the suite takes a minute longer on 2 cores; the test
    extra pins pytest below 9.2, and this says so where another pytest is installed."""
    if not getattr(request.config.option, "loadgroup", False):  # pytest-xdist sets it on its workers
        pytest.skip("not on a pytest-xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@bench.test_pytest_setup"), (
        f"pytest {pytest.__version__} ran {request.node.nodeid} without its xdist group: each module's "
        "fixtures run on both workers (pytest-dev/pytest-xdist#1386); install pytest<9.2")
