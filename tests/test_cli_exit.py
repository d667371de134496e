"""The ``mtrl`` executable (``cli.console``): the command's exit status, then no collections at shutdown.

``console`` runs ``main`` and freezes the objects it built out of the
garbage collector's reach, so the interpreter's exit does not walk them
(docs/performance.md, "The exit of a command"). Checked in a real process
started as a user starts it: the status still comes back, ``atexit``
handlers still run, and by then the objects are frozen.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import atexit, gc, sys
atexit.register(lambda: print(f"at exit: {gc.get_freeze_count()} objects frozen", flush=True))
from mtrl_runtime.cli import console
sys.argv = ["mtrl", *sys.argv[1:]]
sys.exit(console())
"""


def test_the_status_comes_back_and_atexit_runs_with_the_objects_frozen(tmp_path):
    missing = tmp_path / "missing.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "collect", "examples/aircraft_inspection/scripted.yaml",
         "--agent", "examples.aircraft_inspection.agent:run", "--dataset", str(missing), "-n", "1",
         "--run-dir", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr  # the command's own status: a dataset that is not there
    assert f"dataset '{missing}': no such file or folder" in done.stderr
    frozen = int(done.stdout.split("at exit: ")[1].split()[0])
    assert frozen > 1000  # everything the command had built, out of the shutdown collections' way


def test_the_installed_executable_and_python_m_both_go_through_console():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mtrl"] == "mtrl_runtime.cli:console"
    assert "sys.exit(console())" in (ROOT / "mtrl_runtime" / "cli" / "__main__.py").read_text()
