"""scripts/suite_profile.py on a sandbox suite: a sleep is unaccounted time, a waited-for child's CPU is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SANDBOX = '''
import subprocess, sys, time

def test_sleeps():
    time.sleep(0.5)

def test_waits_for_a_busy_child():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"],
                   check=True)
'''


def test_the_profile_splits_each_tests_wall_time_into_its_cpu_its_childrens_and_the_rest(tmp_path):
    (tmp_path / "test_sandbox.py").write_text(SANDBOX)
    out = tmp_path / "profile"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "SUITE_PROFILE_DIR": str(out),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_profile", "-p", "no:cacheprovider",
                           "test_sandbox.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["id"].split("::")[1]: r for r in map(json.loads, (out / "main.jsonl").read_text().splitlines())}
    assert set(rows) == {"test_sleeps", "test_waits_for_a_busy_child"}
    slept, waited = rows["test_sleeps"], rows["test_waits_for_a_busy_child"]
    assert slept["wall"] >= 0.5 and slept["self"] < 0.2 and slept["children"] == 0
    assert waited["children"] >= 0.45 and waited["wall"] >= waited["children"]

    report = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_profile.py"), str(out)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert report.startswith("2 tests: wall ") and "worker main: 2 tests" in report
    unaccounted = report.split("| test | wall s | unaccounted s |")[1]
    # rows by their unaccounted time, most first: on a quiet machine the sleep (all of it unaccounted); on a loaded
    # one the busy child's wait for a core can pass it, so the order is read from the records themselves
    rest = {name: r["wall"] - r["self"] - r["children"] for name, r in rows.items()}
    first, second = sorted(rest, key=rest.get, reverse=True)
    assert unaccounted.index(first) < unaccounted.index(second), (rest, unaccounted)
    assert rest["test_sleeps"] >= 0.45  # a sleep is time neither the test nor a child spent on a CPU

    empty = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_profile.py"), str(tmp_path / "none")],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode != 0 and "no records under" in empty.stderr and "-p suite_profile" in empty.stderr


def test_the_durations_for_the_scheduler_list_the_tests_of_a_second_or_more_at_their_longest(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import suite_profile
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rows = {"gw0": [("t.py::a", 12.34), ("t.py::b", 0.4)], "gw1": [("t.py::a", 3.0), ("t.py::c", 1.0)]}
    for worker, tests in rows.items():
        (tmp_path / f"{worker}.jsonl").write_text("".join(
            json.dumps({"id": i, "worker": worker, "start": 0.0, "wall": w, "self": 0.0, "children": 0.0}) + "\n"
            for i, w in tests))
    assert suite_profile.durations(tmp_path) == {"t.py::a": 12.3, "t.py::c": 1.0}
    with pytest.raises(SystemExit, match="no records under"):
        suite_profile.durations(tmp_path / "none")
