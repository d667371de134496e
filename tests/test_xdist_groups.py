"""The suite's pytest-xdist wiring, run on a sandbox suite: ``xdist_group`` tests stay on one worker, in order.

The sandbox's conftest takes this suite's own ``pytest_configure``
(tests/conftest.py), so it runs with the same wiring as ``pytest -n 2``
here: the ``--dist`` check and tests/_xdist_groups.py's plugin, which
carries the groups that pytest 9.2 drops from xdist 3.8's node ids
(without it this test fails: the group's tests are dealt to both workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import importlib.util
import sys

sys.path.insert(0, {str(TESTS)!r})
_spec = importlib.util.spec_from_file_location("mtrl_suite_conftest", {str(TESTS / "conftest.py")!r})
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
pytest_configure = _suite.pytest_configure
"""

# Each test appends (its name, its worker) to runs.jsonl; a group's tests are spread over two files,
# the second parametrized with per-parameter marks as tests/test_docs.py marks its blocks.
FIRST = """
import json, os, time
import pytest

def record(name):
    with open(os.environ["SANDBOX_LOG"], "a") as log:
        log.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.mark.xdist_group("page")
@pytest.mark.parametrize("i", range(4))
def test_page_first(i):
    record(f"first{i}")
    time.sleep(0.05)

@pytest.mark.parametrize("i", range(12))
def test_free(i):
    record(f"free{i}")
    time.sleep(0.05)
"""

SECOND = """
import pytest
from test_first import record

@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.xdist_group("page")) for i in range(4)])
def test_page_second(i):
    record(f"second{i}")
"""


def _sandbox(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_first.py").write_text(FIRST)
    (tmp_path / "test_second.py").write_text(SECOND)
    log = tmp_path / "runs.jsonl"
    env = {"SANDBOX_LOG": str(log), "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin",
                           "-p", "no:schemathesis", "-c",
                           str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), *args, str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, **env})
    runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, runs


def test_a_group_runs_on_one_worker_in_collection_order(tmp_path):
    done, runs = _sandbox(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(runs) == 20, runs
    names = [name for name, _ in runs]
    assert names.index("free0") < names.index("free11"), runs  # no durations file: collection order
    page = [(name, worker) for name, worker in runs if not name.startswith("free")]
    assert [name for name, _ in page] == [f"first{i}" for i in range(4)] + [f"second{i}" for i in range(4)], page
    assert len({worker for _, worker in page}) == 1, f"the group's tests ran on several workers: {page}"


def test_a_dist_mode_other_than_loadgroup_is_refused_naming_the_fix(tmp_path):
    done, runs = _sandbox(tmp_path, "-n", "2", "--dist", "load")
    assert done.returncode == 4 and runs == [], done.stdout[-3000:] + done.stderr[-3000:]
    assert "--dist load: this suite runs under pytest-xdist with --dist loadgroup only" in done.stdout + done.stderr


def test_the_longest_work_starts_first_by_the_recorded_durations(tmp_path):
    """free11 sorts last; the durations file makes it the first test its worker runs, before the page group."""
    durations = tmp_path / "tests" / "data" / "suite_durations.json"
    durations.parent.mkdir(parents=True)
    durations.write_text(json.dumps({"test_first.py::test_free[11]": 30.0, "test_second.py::test_page_second[0]": 9.0}))
    done, runs = _sandbox(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = [name for name, _ in runs]
    assert len(runs) == 20 and names.index("free11") < names.index("free0"), runs
    worker = dict(runs)["free11"]
    assert [name for name, w in runs if w == worker][0] == "free11", runs
    page = [name for name in names if not name.startswith("free")]
    assert page == [f"first{i}" for i in range(4)] + [f"second{i}" for i in range(4)], page  # still in order
