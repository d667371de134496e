"""What a child forked from the test suite's preloaded python costs, against a fresh ``python SCRIPT``.

tests/_preloaded_python.py forks one child per request from a server that
imported torch, transformers and MLflow, so that a test's processes skip
those imports. A child still pays for its own work and for its exit (the
interpreter's finalization), and every page of the server's memory that it
writes is copied (copy-on-write). This bench runs the same scripts both
ways, side by side in one run, and reports each child's CPU (user and
system, read from the server's reaped children in ``/proc``) against a fresh
process's (``os.times`` of this process's children):

- ``empty``: ``pass``: the fork's own overhead;
- ``mtrl``: imports what an ``mtrl`` command imports before its work.

``--server PATH`` takes the server module from another tree (the tree before
a change); default this tree's.

    python bench/preloaded_fork.py [--rounds 5] [--server OTHER/tests/_preloaded_python.py] [--out FILE]

Writes bench/results/preloaded_fork.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import machine_info

REPO = Path(__file__).resolve().parents[1]


def _docs_preload() -> list[str]:
    """The docs pages' preload (``tests/_docs_preload.py``), the modules that cost a fresh process its seconds, less
    matplotlib's (no ``mtrl`` command imports them; the recorded results were taken without them)."""
    spec = importlib.util.spec_from_file_location("_docs_preload_bench", REPO / "tests" / "_docs_preload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name in module.PRELOAD if not name.startswith("matplotlib")]


SCRIPTS = {
    "empty": "pass\n",
    "mtrl": "import mtrl_runtime.cli.train, mtrl_runtime.training, mtrl_runtime.engines.hf, mtrl_runtime.server\n",
}
TICK = os.sysconf("SC_CLK_TCK")


def _children_cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[13]) / TICK, int(fields[14]) / TICK  # cutime, cstime: its reaped children's


def _server_class(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("_preloaded_python_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PreloadedPython


def measure(server_module: Path, rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="preloaded-fork-"))
    scripts = {}
    for name, code in SCRIPTS.items():
        scripts[name] = work / f"{name}.py"
        scripts[name].write_text(code)
    results: dict[str, Any] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with _server_class(server_module)(_docs_preload(), work, env=env) as server:
        started = time.monotonic()
        server.run(scripts["empty"], timeout=600)  # the first request waits for the server's imports
        results["server_imports_s_wall"] = round(time.monotonic() - started, 2)
        for name, script in scripts.items():
            user0, sys0 = _children_cpu(server.server.pid)
            for _ in range(rounds):
                done = server.run(script, timeout=600)  # the server's own environment: forked by every version
                assert done.returncode == 0, done.stderr
            user1, sys1 = _children_cpu(server.server.pid)
            results[f"forked_{name}"] = {"user_s": round((user1 - user0) / rounds, 3),
                                         "system_s": round((sys1 - sys0) / rounds, 3)}
    for name, script in scripts.items():
        before = os.times()
        for _ in range(rounds):
            subprocess.run([sys.executable, str(script)], check=True, capture_output=True, env=env, cwd=REPO)
        after = os.times()
        results[f"fresh_{name}"] = {"user_s": round((after.children_user - before.children_user) / rounds, 3),
                                    "system_s": round((after.children_system - before.children_system) / rounds, 3)}
    for name in SCRIPTS:
        forked, fresh = results[f"forked_{name}"], results[f"fresh_{name}"]
        results[f"{name}_fresh_over_forked"] = round(
            (fresh["user_s"] + fresh["system_s"]) / max(forked["user_s"] + forked["system_s"], 1e-3), 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server", type=Path, default=REPO / "tests" / "_preloaded_python.py")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "preloaded_fork.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    figures = measure(args.server, args.rounds)
    record = {"benchmark": "preloaded_fork", "command": " ".join(["bench/preloaded_fork.py", *sys.argv[1:]]),
              "server": str(args.server), "rounds": args.rounds,
              "machine": machine_info(load_before, os.getloadavg(), 1, dtype="none (no model runs)"),
              "recorded_at": time.strftime("%Y-%m-%d %H:%M"), **figures}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
