"""Soak: many concurrent rollouts against one coordinator process for a fixed time; errors, latency, memory.

The coordinator runs in its own process (this file with ``--serve``), served
by uvicorn on 127.0.0.1 over the scripted engine, with its trajectory store
in a temporary run folder. ``--rollouts`` workers in this process each run
rollouts back to back until ``--seconds`` have passed: open a rollout
(``POST /v1/rollouts``), three chat turns whose requests extend the
conversation (the first two answer with a tool call, each reported to
``/tool_calls``), ``/reward``, ``/complete``; then the next rollout. When
the time is up no new rollout starts; the ones in flight finish (each
request has a 60 s limit, the whole run a hard stop at ``seconds + 180``),
and the coordinator process stops itself if this one dies.

Reported: requests served and errors (any non-2xx or transport error), p50
and p99 latency in the first and the last window (one minute, or a quarter
of the run if shorter), the coordinator's RSS after warm-up (end of the
first window) and at the end, and rollouts lost (completed by a worker but
not ``completed`` in the store). Goal: zero errors, zero lost, RSS growth
under 10% after warm-up.

    python bench/soak.py [--rollouts 256] [--seconds 600]

Writes bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from mtrl_runtime.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "soak.json"
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
TURNS = 3
REQUEST_TIMEOUT_S = 60.0
HARD_STOP_MARGIN_S = 180.0


# ------------------------------------------------------------------ the coordinator process


def serve(port: int, run_dir: Path, max_seconds: float) -> None:
    """Serve a coordinator over the scripted engine until killed or ``max_seconds`` pass."""
    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
    from mtrl_runtime.server import create_app, start_server
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.testing import tiny_tokenizer

    def policy(request: Any, prompt: str) -> Any:
        if request.turn_index < TURNS - 1:
            return ScriptedReply.tool_call("lookup", {"key": f"K{request.turn_index}"})
        return "The value is 42. DONE"

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = MtrlConfig.from_dict({"core": {"max_turns": 8, "run_dir": str(run_dir)}})
    store = SQLiteStore(config.run_folder.store)
    app = create_app(Coordinator(ScriptedEngine(tiny_tokenizer(), policy), store, config))
    handle = start_server(app, "127.0.0.1", port)  # the serving path the trainer uses
    try:
        stop.wait(max_seconds)  # never outlive the run, even if the parent dies
    finally:
        handle.stop()
        store.close()


# ------------------------------------------------------------------ the load


@dataclass
class Tally:
    """Every request's (start time, seconds, route) and every error, as the workers saw them."""

    started: float
    requests: list[tuple[float, float, str]] = field(default_factory=list)
    errors: list[tuple[float, str, str]] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)


async def call(http: httpx.AsyncClient, tally: Tally, route: str, url: str, body: Any, token: str | None) -> Any:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    t0 = time.monotonic()
    try:
        response = await http.post(url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        tally.errors.append((t0 - tally.started, route, f"{type(exc).__name__}: {exc}"[:200]))
        return None
    tally.requests.append((t0 - tally.started, time.monotonic() - t0, route))
    if response.status_code != 200:
        tally.errors.append((t0 - tally.started, route, f"{response.status_code}: {response.text[:200]}"))
        return None
    return response.json()


async def one_rollout(http: httpx.AsyncClient, url: str, tally: Tally, n: int) -> None:
    created = await call(http, tally, "create", f"{url}/v1/rollouts", {"task_id": f"soak-{n}", "prompt": "q"}, None)
    if created is None:
        return
    rid, token = created["rollout_id"], created["token"]
    base = f"{url}/rollouts/{rid}"
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Find the value of K{n % 100}."}]
    for turn in range(TURNS):
        reply = await call(http, tally, "chat", f"{base}/v1/chat/completions",
                           {"model": "policy", "messages": messages, "tools": TOOLS}, token)
        if reply is None:
            return
        message = reply["choices"][0]["message"]
        messages.append(message)
        for tc in message.get("tool_calls") or []:
            report = {"name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"]),
                      "call_id": tc["id"], "result": "42", "latency_s": 0.001}
            if await call(http, tally, "tool_call", f"{base}/tool_calls", report, token) is None:
                return
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "42"})
    if await call(http, tally, "reward", f"{base}/reward", {"reward": 1.0, "metrics": {"turns": TURNS}}, token) is None:
        return
    state = await call(http, tally, "complete", f"{base}/complete", {"status": "completed"}, token)
    if state is not None and state["status"] == "completed" and state["turns"] == TURNS:
        tally.completed.append(rid)
    elif state is not None:
        tally.errors.append((time.monotonic() - tally.started, "complete", f"unexpected state {state}"))


async def worker(http: httpx.AsyncClient, url: str, tally: Tally, deadline: float, index: int, counter: list[int]) -> None:
    while time.monotonic() < deadline:
        counter[0] += 1
        await one_rollout(http, url, tally, counter[0])


async def sample_rss(pid: int, tally: Tally, samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        samples.append((time.monotonic() - tally.started, process.memory_info().rss))
        try:
            await asyncio.wait_for(stop.wait(), 2.0)
        except asyncio.TimeoutError:
            pass


async def load(url: str, pid: int, rollouts: int, seconds: float) -> tuple[Tally, list[tuple[float, int]]]:
    tally = Tally(started=time.monotonic())
    deadline = tally.started + seconds
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(pid, tally, samples, stop))
    limits = httpx.Limits(max_connections=rollouts, max_keepalive_connections=rollouts)
    counter = [0]
    async with httpx.AsyncClient(limits=limits) as http:
        workers = [asyncio.create_task(worker(http, url, tally, deadline, i, counter)) for i in range(rollouts)]
        done, pending = await asyncio.wait(workers, timeout=seconds + HARD_STOP_MARGIN_S)
        for task in pending:  # past the hard stop: counted as errors, never waited on
            task.cancel()
            tally.errors.append((time.monotonic() - tally.started, "hard_stop", "a rollout outlived the hard stop"))
    stop.set()
    await sampler
    samples.append((time.monotonic() - tally.started, psutil.Process(pid).memory_info().rss))
    return tally, samples


# ------------------------------------------------------------------ the report


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def window_stats(tally: Tally, start: float, end: float) -> dict[str, Any]:
    latencies = [s for t, s, _ in tally.requests if start <= t < end]
    return {
        "from_s": round(start, 1), "to_s": round(end, 1), "requests": len(latencies),
        "errors": sum(1 for t, _, _ in tally.errors if start <= t < end),
        "p50_ms": None if not latencies else round(1000 * percentile(latencies, 0.50), 2),
        "p99_ms": None if not latencies else round(1000 * percentile(latencies, 0.99), 2),
    }


def rss_at(samples: list[tuple[float, int]], t: float) -> int:
    return min(samples, key=lambda s: abs(s[0] - t))[1]


def stored_completed(run_dir: Path, rollout_ids: list[str]) -> tuple[int, list[str]]:
    from mtrl_runtime.run_folder import RunFolder
    from mtrl_runtime.store import SQLiteStore

    with SQLiteStore(RunFolder(run_dir).store) as store:
        missing = [rid for rid in rollout_ids
                   if (r := store.get_rollout(rid, with_turns=False)) is None or r.status.value != "completed"]
        total = len(store.rollouts(status="completed", with_turns=False))
    return total, missing


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the coordinator process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"the coordinator did not answer {url}/health within {timeout:g} s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, port = Path(tmp) / "run", free_port()
        run_dir.mkdir()
        log_path = Path(tmp) / "coordinator.log"
        max_seconds = args.seconds + HARD_STOP_MARGIN_S + 120
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", "--port", str(port), "--run-dir", str(run_dir),
                 "--max-seconds", str(max_seconds)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(proc, url)
            tally, samples = asyncio.run(load(url, proc.pid, args.rollouts, args.seconds))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log_tail = log_path.read_text()[-3000:]
        in_store, missing = stored_completed(run_dir, tally.completed)
    window = min(60.0, args.seconds / 4)
    end = max(t for t, _, _ in tally.requests) if tally.requests else args.seconds
    first, last = window_stats(tally, 0, window), window_stats(tally, args.seconds - window, args.seconds)
    warm, final = rss_at(samples, window), samples[-1][1]
    error_kinds: dict[str, int] = {}
    for _, route, text in tally.errors:
        key = f"{route}: {text[:80]}"
        error_kinds[key] = error_kinds.get(key, 0) + 1
    return {
        "command": "python bench/soak.py " + " ".join(sys.argv[1:]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg_end": os.getloadavg(),
                    "dtype": "none (scripted engine: no model runs)"},
        "rollouts_concurrent": args.rollouts, "seconds": args.seconds, "ran_s": round(end, 1),
        "requests_served": len(tally.requests), "requests_per_s": round(len(tally.requests) / max(end, 1e-9), 1),
        "errors": len(tally.errors), "error_kinds": error_kinds,
        "rollouts_completed": len(tally.completed), "rollouts_completed_in_store": in_store,
        "lost": len(missing),
        "first_window": first, "last_window": last,
        "rss_mb_after_warmup": round(warm / 2**20, 1), "rss_mb_end": round(final / 2**20, 1),
        "rss_growth_pct": round(100 * (final - warm) / warm, 2),
        "rss_mb_samples": [(round(t, 1), round(r / 2**20, 1)) for t, r in samples[:: max(1, len(samples) // 60)]],
        "coordinator_log_tail": log_tail if tally.errors else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=256, help="rollouts in flight at once")
    parser.add_argument("--seconds", type=float, default=600.0, help="how long new rollouts keep starting")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the coordinator process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--max-seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.run_dir, args.max_seconds)
        return 0
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    shown = {k: v for k, v in report.items() if k not in ("rss_mb_samples", "coordinator_log_tail")}
    print(json.dumps(shown, indent=1))
    ok = report["errors"] == 0 and report["lost"] == 0 and report["rss_growth_pct"] < 10
    print("soak:", "PASS" if ok else "FAIL", f"(errors {report['errors']}, lost {report['lost']}, "
          f"rss growth {report['rss_growth_pct']}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
