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

import pytest

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


IMPORTS_PROBE = """
import sys
from mtrl_runtime.cli import console
sys.argv = ["mtrl", *sys.argv[1:]]
try:
    status = console()
except SystemExit as stop:  # rescore exits on a missing run
    status = stop.code
print("transformers imported:", "transformers" in sys.modules, flush=True)
if sys.argv[1] == "collect":
    from transformers import LlamaForCausalLM  # what a training command loads
    print("sklearn imported:", "sklearn" in sys.modules, flush=True)
sys.exit(status)
"""


def test_a_command_that_loads_models_imports_them_without_sklearn(tmp_path):
    # console leaves scikit-learn out of transformers' imports before a command that may load a model class
    # (cli/_imports.py): a model class loaded after it brings no sklearn (with the switch taken out, it does)
    done = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, "collect", "examples/aircraft_inspection/scripted.yaml",
                           "--agent", "examples.aircraft_inspection.agent:run", "--dataset",
                           str(tmp_path / "missing.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr  # the dataset is missing; the probe then loads a model class
    assert "sklearn imported: False" in done.stdout, done.stdout + done.stderr


def test_a_command_that_loads_no_model_leaves_transformers_alone(tmp_path):
    # rescore loads no model class (Command.loads_models False): console does not even import transformers for it
    done = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, "rescore", str(tmp_path / "no-run"), "--reward",
                           "examples.aircraft_inspection.agent:run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0, done.stdout  # the run is missing
    assert "transformers imported: False" in done.stdout, done.stdout + done.stderr


def test_leaving_out_sklearn_after_transformers_generation_was_imported_changes_nothing():
    import transformers.generation.candidate_generator  # noqa: F401  (this process has it, as a test worker does)
    from transformers.utils import is_sklearn_available

    from mtrl_runtime.cli._imports import leave_out_sklearn

    before = is_sklearn_available()
    assert leave_out_sklearn() is False
    import transformers.utils

    assert transformers.utils.is_sklearn_available is is_sklearn_available and is_sklearn_available() == before
