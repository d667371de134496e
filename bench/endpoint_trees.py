"""Chat completions through two versions of the server, side by side in one run: interleaved rounds, paired ratios.

Two ``mtrl serve`` processes on the scripted engine (so the model costs
nothing), one from ``--before`` (a source tree unpacked from an earlier
commit) and one from this tree, both up for the whole run. Each setting of
``endpoint_overhead`` (1 client, 32 clients, 1 client streamed) runs the two
servers in ``--rounds`` interleaved rounds (``_rounds``: the order rotated
every round, ``--requests / --rounds`` first turns of fresh rollouts a run,
``endpoint_overhead``'s raw keep-alive HTTP/1.1 client), so the drift of a
shared machine's load falls on both alike. Reported per setting: p50/p95 and
the server's CPU per call (from /proc of each server, robust to other load),
pooled over the rounds, as a ratio after / before, and the median and range
of the ratios paired round by round.

``--asgi``: the same, with no socket: each tree's app is called in process
by a worker of its own (``_asgi_calls``), the calls one after the other, and
the CPU is the worker's own (``time.process_time``), so what the route costs
shows without the HTTP parsing, the client and the kernel, which on a loaded
machine add most of the noise.

    git archive <commit> mtrl_runtime mtrl_adapters | tar -x -C /tmp/before
    .venv/bin/python bench/endpoint_trees.py --before /tmp/before [--requests 600] [--rounds 6] [--asgi]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable

from _machine import load_note, machine_info
from _rounds import interleaved, paired, pooled, report_row
from endpoint_overhead import MESSAGES, SETTINGS, TOOLS, first_turns, start_server

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "endpoint_trees.json"


def _body(stream: bool) -> bytes:
    return json.dumps({"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64, "stream": stream,
                       **({"stream_options": {"include_usage": True}} if stream else {})}).encode()


Runner = Callable[[str, int, bool, int], Awaitable[dict]]  # (tree, clients, stream, calls) -> a _rounds.Run


async def compare(run: Runner, settings: dict[str, tuple[int, bool]], names: list[str], rounds: int,
                  per_run: int) -> dict[str, Any]:
    """Each setting in ``rounds`` interleaved rounds of both trees: pooled figures and ratios after / before."""
    for name in names:  # warm-up: imports, caches, the first calls of both paths
        await run(name, 8, False, 200)
        await run(name, 1, True, 50)
    out = {}
    for setting, (concurrency, stream) in settings.items():
        runs = await interleaved(lambda name: run(name, concurrency, stream, per_run), names, rounds)
        base, after = pooled(runs["before"]), pooled(runs["after"])
        out[setting] = {
            "before": base,
            "after": {**after,
                      "p50_ratio": after["p50_ms"] / base["p50_ms"],
                      "p95_ratio": after["p95_ms"] / base["p95_ms"],
                      "cpu_ratio": after["server_cpu_ms_per_call"] / base["server_cpu_ms_per_call"],
                      "paired_p50_ratio": paired(runs["after"], runs["before"], "p50_ms"),
                      "paired_cpu_ratio": paired(runs["after"], runs["before"], "server_cpu_ms_per_call")},
        }
    return out


async def over_http(trees: dict[str, Path], rounds: int, per_run: int) -> dict[str, Any]:
    """Both trees' ``mtrl serve``, called over loopback HTTP (``endpoint_overhead``'s client and settings)."""
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        try:
            for name, tree in trees.items():
                (Path(tmp) / name).mkdir()
                servers[name] = start_server(Path(tmp) / name, tree)

            async def run(name: str, concurrency: int, stream: bool, calls: int) -> dict:
                proc, port = servers[name]
                end = b"[DONE]" if stream else b"}"
                return await first_turns(port, proc.pid, calls, concurrency, "/v1/chat/completions", _body(stream),
                                         lambda status, answer: status == 200 and answer.rstrip().endswith(end))

            return await compare(run, SETTINGS, list(trees), rounds, per_run)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(10)


async def in_process(trees: dict[str, Path], rounds: int, per_run: int) -> dict[str, Any]:
    """Both trees' apps called in process by a worker each (``_asgi_calls``), one call at a time."""
    workers: dict[str, subprocess.Popen] = {}
    try:
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
            workers[name] = subprocess.Popen([sys.executable, str(Path(__file__).parent / "_asgi_calls.py")], cwd=tree,
                                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert json.loads(workers[name].stdout.readline())["ready"]

        async def run(name: str, concurrency: int, stream: bool, calls: int) -> dict:
            worker = workers[name]
            worker.stdin.write(json.dumps({"n": calls, "stream": stream}) + "\n")
            worker.stdin.flush()
            return json.loads(worker.stdout.readline())

        settings = {name: (1, stream) for name, (_, stream) in SETTINGS.items() if name != "clients_32"}
        return await compare(run, settings, list(trees), rounds, per_run)
    finally:
        for worker in workers.values():
            worker.stdin.close()
            worker.wait(30)


async def main(n: int, rounds: int, before: Path, asgi: bool = False) -> dict:
    per_run = max(1, n // rounds)
    load_before = os.getloadavg()
    trees = {"before": before, "after": ROOT}
    results: dict = {"requests_per_tree_and_setting": per_run * rounds, "rounds": rounds, "requests_per_run": per_run,
                     "trees": {k: str(v) for k, v in trees.items()}, "order": "before, after; rotated every round",
                     "calls": "in process (ASGI, no socket), one at a time" if asgi else "loopback HTTP, mtrl serve"}
    results["settings"] = await (in_process if asgi else over_http)(trees, rounds, per_run)
    load_after = os.getloadavg()
    results["machine"] = machine_info(load_before, load_after, 0, dtype="none (scripted engine: no model runs)")
    results["load"] = load_note(load_before, load_after, "latencies are queueing; read the server CPU per call")
    return results


def report(results: dict) -> None:
    m = results["machine"]
    print(f"chat completions ({results['calls']}), before vs after, {results['requests_per_tree_and_setting']} calls "
          f"per tree and setting "
          f"in {results['rounds']} interleaved rounds (load average {m['loadavg_before'][0]:.1f} at start, "
          f"{m['loadavg_after'][0]:.1f} at end; {results['load']})")
    print(f"{'clients':>8} {'tree':>7} {'p50':>10} {'x before':>7} {'p95':>10} {'x before':>7} {'server CPU/call':>16} "
          f"{'x before':>7} {'errors':>7}   paired by round, median [range]: p50, CPU")
    for name, s in results["settings"].items():
        label = name.removeprefix("clients_").replace("_stream", " SSE")
        print(report_row(label, "before", s["before"], 7))
        print(report_row(label, "after", s["after"], 7))
    every = [s["after"] for s in results["settings"].values()]
    print(f"goal: within 1.05x of before: worst pooled server CPU per call {max(r['cpu_ratio'] for r in every):.2f}x, "
          f"worst pooled p50 {max(r['p50_ratio'] for r in every):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="the source tree of the earlier server")
    parser.add_argument("--requests", type=int, default=600, help="calls per tree and setting, over all rounds")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per setting (see _rounds)")
    parser.add_argument("--asgi", action="store_true", help="call each tree's app in process, no socket (see above)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    out = asyncio.run(main(args.requests, args.rounds, args.before.resolve(), args.asgi))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    report(out)
