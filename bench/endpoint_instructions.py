"""Instructions per chat completion of two server trees, counted by callgrind: a figure the machine's load cannot move.

``endpoint_trees`` times both trees; on a shared machine its CPU per call
still drifts by about 10% between identical trees. This counts instead:
each tree's app (``_asgi_calls``' in-process call, the scripted engine, a
SQLite store) runs under ``valgrind --tool=callgrind`` with instrumentation
off through its imports and warm-up (30 plain and 30 streamed calls); then
``--calls`` plain and ``--calls`` streamed first turns of fresh rollouts
(created before) run inside ``itertools.starmap``, the only place callgrind
counts (``--toggle-collect=starmap_next``), each window dumped on its own.
Both trees run at once (about three minutes for 100 calls on two cores).
Runs of one tree differ by about 0.5% (where the garbage collector's
passes fall); cache misses are not counted (``--cache-sim=yes``, added by
hand, showed them following the instructions).

    git archive <commit> mtrl_runtime mtrl_adapters | tar -x -C /tmp/before
    .venv/bin/python bench/endpoint_instructions.py --before /tmp/before [--calls 100]

Needs ``valgrind`` (callgrind and ``callgrind_control``) on the PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from _machine import machine_info, save_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "endpoint_instructions.json"


def worker(calls: int) -> None:
    """In the tree's process: warm up, then for each window wait for a line on stdin and run its calls."""
    from _asgi_calls import _call
    from endpoint_overhead import MESSAGES, TOOLS
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.server import create_app
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.testing import tiny_tokenizer
    from mtrl_runtime.types import Task

    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "trajectories.db")
        coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), lambda request, prompt: "DONE"), store)
        app = create_app(coordinator)

        def rollouts(n: int) -> list:  # created before a window: what is counted is the calls alone
            return [coordinator.create_rollout(Task(id=f"t{i % 50}", prompt="inspect")) for i in range(n)]

        async def run(rollouts: list, stream: bool) -> None:
            body = json.dumps({"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64,
                               "stream": stream,
                               **({"stream_options": {"include_usage": True}} if stream else {})}).encode()
            end = b"[DONE]" if stream else b"}"
            for rollout in rollouts:
                status, answer = await _call(app, f"/rollouts/{rollout.rollout_id}/v1/chat/completions", body,
                                             rollout.token)
                if not (status == 200 and answer.rstrip().endswith(end)):
                    raise RuntimeError(f"call failed: {status} {answer[:200]!r}")

        loop.run_until_complete(run(rollouts(30), False))
        loop.run_until_complete(run(rollouts(30), True))
        for stream in (False, True):
            fresh = rollouts(calls)
            print("ready", flush=True)
            sys.stdin.readline()
            list(itertools.starmap(lambda: loop.run_until_complete(run(fresh, stream)), [()]))
            print("done", flush=True)
        store.close()
    loop.close()


def count(tree: Path, calls: int, out: Path) -> dict[str, float]:
    """Instructions per call of ``tree``, plain and streamed (each window dumped by ``callgrind_control``)."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
           "--toggle-collect=starmap_next", f"--callgrind-out-file={out}.%p", sys.executable, __file__,
           "--worker", "--calls", str(calls)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    control = lambda *args: subprocess.run(["callgrind_control", *args, str(proc.pid)], check=True,  # noqa: E731
                                           capture_output=True)
    for window in range(2):
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{tree}: the worker did not start (exit {proc.poll()})")
        control("-i", "on") if window == 0 else control("-z")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"{tree}: the calls failed (exit {proc.poll()})")
        control("-d")
    proc.stdin.close()
    proc.wait()
    dumps = sorted(Path(out.parent).glob(f"{out.name}.{proc.pid}.*"), key=lambda p: int(p.suffix[1:]))
    totals = [int(re.search(r"^totals: (\d+)", p.read_text(), re.M).group(1)) for p in dumps]
    if len(totals) != 2:
        raise RuntimeError(f"{tree}: expected 2 callgrind dumps, found {[str(p) for p in dumps]}")
    return {"plain": totals[0] / calls, "streamed": totals[1] / calls}


def main(before: Path, calls: int) -> dict[str, dict[str, float]]:
    trees = {"before": before, "after": ROOT}
    counts: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        threads = [threading.Thread(target=lambda n=n, t=t: counts.__setitem__(n, count(t, calls, Path(tmp) / n)))
                   for n, t in trees.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    missing = set(trees) - set(counts)
    if missing:
        raise RuntimeError(f"no count for {sorted(missing)} (see the error above)")
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, help="the source tree of the earlier server")
    parser.add_argument("--calls", type=int, default=100, help="counted calls per tree and setting")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.calls)
        sys.exit()
    if args.before is None:
        parser.error("--before is required")
    load_before = os.getloadavg()
    result = main(args.before.resolve(), args.calls)
    out = {"command": " ".join(sys.argv), "calls": args.calls, "instructions_per_call": result,
           "machine": machine_info(load_before, os.getloadavg(), 0, dtype="none (scripted engine: no model runs)")}
    save_results(args.out, out)
    for setting in ("plain", "streamed"):
        b, a = result["before"][setting], result["after"][setting]
        print(f"{setting:9s} before {b:12,.0f}  after {a:12,.0f} instructions per call  ({a / b:.3f}x)")
