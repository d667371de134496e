"""The install the README and the quickstart describe: a built wheel with only the ``strands`` extra.

The test builds the wheel from this tree (``pip wheel --no-deps``), installs
it into a virtualenv of its own with the ``strands`` extra and the
dependencies the wheel declares (no ``--system-site-packages``: nothing of
the project's ``.venv`` is visible there), and checks, from a folder
outside the repository, that ``mtrl_adapters`` imports without torch, that
the other extras' frameworks are absent, that the data files of the
examples are in the wheel, that ``mtrl --help`` runs, and that the
installed packages alone run a decorated Strands agent against the scripted
engine (the quickstart's "Try it without training", one tool call recorded).

Installing the declared dependencies (torch, transformers, MLflow, Strands,
...) into an empty venv took 3 min 1 s alone and 4 min 50 s for the whole
test at load average 5 on the 2-core dev machine (from pip's local wheel
cache), past the suite's budget, so the venv is cached:
its folder is keyed by the Python version and the wheel's dependency list
for that extra (``Requires-Dist`` of the wheel's METADATA), under
``$MTRL_TEST_CACHE`` (default ``~/.cache/mtrl-tests``). A cache miss (a new
machine, or a changed dependency) builds it from nothing; a hit reinstalls
the freshly built wheel into it (``--force-reinstall --no-deps``), asks pip
to install ``<wheel>[strands]`` again (which must find every declared
dependency already satisfied, and installs whatever is not) and runs
``pip check``. A venv left half-built by an interrupted run has no
``.complete`` stamp and is rebuilt. With the cache warm the test takes
about 35 s (load average 5), 60 s at load average 9.

pip installs with ``--no-compile``: byte-compiling the 20,400 modules of
the venv is 42 s of CPU (``compileall``, 2 min 35 s of wall at load
average 14), work no check here needs (Python compiles what a run imports).
With it, a cold run took 4 min 32 s at load average 11.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTRA = "strands"
# --no-compile: pip byte-compiles every installed module by default (torch, transformers, MLflow: tens of
# thousands of files); Python compiles the few a run imports when it imports them, so nothing this test
# checks depends on it.
PIP_QUIET = ("-q", "--no-compile", "--disable-pip-version-check")


def _requires(wheel: Path, extra: str) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that apply with ``extra`` (no marker, or ``extra == ...``)."""
    with zipfile.ZipFile(wheel) as zf:
        [metadata] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(metadata).decode()
    wanted = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if ";" not in req or f'extra == "{extra}"' in req:
            wanted.append(req)
    return sorted(wanted)


def _cache_root() -> Path:
    if os.environ.get("MTRL_TEST_CACHE"):
        return Path(os.environ["MTRL_TEST_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mtrl-tests"


def _run(argv: list, cwd: Path, timeout: float = 600, *, stderr: bool = False) -> str:
    """``argv``'s stdout (with ``stderr``: both, where a build backend's warnings go), once it exited 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr if stderr else done.stdout


@pytest.mark.timeout(900)
def test_the_wheel_installs_with_the_strands_extra_and_runs(tmp_path):
    source = tmp_path / "src"  # a copy of what git would ship, so the build leaves nothing in the tree
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  tmp_path / "dist", source], cwd=tmp_path, stderr=True)
    # the examples' data folders (fixtures/, instances/, db/) ship as package data, not as packages setuptools
    # would warn it ignores (a page of warnings per folder on every install, include-package-data's)
    assert "Package would be ignored" not in built, built[-3000:]
    [wheel] = (tmp_path / "dist").glob("mtrl_agents-*.whl")
    requires = _requires(wheel, EXTRA)
    assert any(r.startswith("strands-agents") for r in requires), requires
    assert not any(r.startswith("langgraph") for r in requires), requires

    key = hashlib.sha256("\n".join([sys.version, EXTRA, *requires]).encode()).hexdigest()[:16]
    venv = _cache_root() / f"wheel-venv-{EXTRA}-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
        _run([python, "-m", "pip", "install", *PIP_QUIET, f"{wheel}[{EXTRA}]"], cwd=tmp_path, timeout=840)
        (venv / ".complete").write_text("\n".join(requires) + "\n")
    else:
        _run([python, "-m", "pip", "install", *PIP_QUIET, "--force-reinstall", "--no-deps", wheel], cwd=tmp_path)
        _run([python, "-m", "pip", "install", *PIP_QUIET, f"{wheel}[{EXTRA}]"], cwd=tmp_path)
    _run([python, "-m", "pip", "check"], cwd=tmp_path)

    probe = (
        "import importlib.util, json, sys\n"
        "import mtrl_adapters, mtrl_adapters.strands\n"
        "from mtrl_adapters import rollout, update_reward\n"
        "torch_loaded = 'torch' in sys.modules\n"
        "import mtrl_examples, mtrl_integrations, mtrl_runtime\n"
        "from pathlib import Path\n"
        "print(json.dumps({'torch_loaded': torch_loaded, 'adapters': mtrl_adapters.__file__,\n"
        "  'langgraph': importlib.util.find_spec('langgraph') is not None,\n"
        "  'strands': importlib.util.find_spec('strands') is not None,\n"
        "  'instances': sorted(p.name for p in (Path(mtrl_examples.__file__).parent / 'aircraft_inspection' / 'instances').glob('*.jsonl'))}))\n"
    )
    import json

    facts = json.loads(_run([python, "-c", probe], cwd=tmp_path).strip().splitlines()[-1])
    assert facts["torch_loaded"] is False, "importing mtrl_adapters (and its Strands hooks) imported torch"
    assert Path(facts["adapters"]).is_relative_to(venv), f"mtrl_adapters came from {facts['adapters']}, not the venv"
    assert facts["strands"] and not facts["langgraph"], facts
    assert facts["instances"] == ["test.jsonl", "train.jsonl", "val.jsonl"], facts
    helped = _run([venv / "bin" / "mtrl", "--help"], cwd=tmp_path)
    for command in ("serve", "train", "eval", "check", "collect", "demo", "export"):
        assert command in helped, helped

    # The installed wheel alone runs a decorated Strands agent against the scripted engine (the
    # quickstart's "Try it without training"): one tool call, one answer, recorded in the store.
    (tmp_path / "try_it.py").write_text(TRY_IT)
    out = _run([python, tmp_path / "try_it.py"], cwd=tmp_path, timeout=300)
    assert out.strip().splitlines()[-1] == "completed 1.0 [('lookup', {'key': 'A1'}, '42')]", out


TRY_IT = """
import asyncio

from strands import Agent, tool
from strands.models.openai import OpenAIModel

from mtrl_adapters import rollout, update_reward
from mtrl_adapters.strands import agent_factory
from mtrl_runtime import MtrlConfig, ScriptedEngine, Task
from mtrl_runtime.engines import ScriptedReply
from mtrl_runtime.rollouts import collect_rollouts
from mtrl_runtime.testing import tiny_tokenizer


@tool
def lookup(key: str) -> int:
    \"\"\"Look a key up in the table.\"\"\"
    return {"A1": 42}[key]


model = OpenAIModel(client_args={"api_key": "sk-unused"}, model_id="policy")
make_agent = agent_factory(lambda: Agent(model=model, tools=[lookup], callback_handler=None))


@rollout
async def run(task):
    result = await make_agent().invoke_async(task.prompt)
    update_reward(1.0 if str(task.ground_truth) in str(result) else 0.0)
    return str(result)


engine = ScriptedEngine(tiny_tokenizer(), [ScriptedReply.tool_call("lookup", {"key": "A1"}), "The answer is 42."])
config = MtrlConfig.coerce({"core": {"run_dir": "runs/try", "group_size": 1}})
task = Task(id="t1", prompt="What is stored under A1?", ground_truth=42)
collected = asyncio.run(collect_rollouts(config, run, [task], engine=engine))
[record] = collected.rollouts
print(record.status.value, record.reward, [(c.name, c.arguments, c.result) for c in record.tool_calls])
"""
