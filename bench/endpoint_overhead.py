"""What the policy endpoint adds per chat completion, against the same engine called in process.

Side by side in one run, on the scripted engine (so the model costs nothing):

1. in process: ``await engine.generate(...)`` on the prompt the endpoint would build;
2. through the endpoint: an HTTP chat completion attributed to a rollout, which
   renders the chat template, tokenizes, generates, parses tool calls and commits
   the turn to SQLite before answering (``mtrl serve`` in its own process).

Reported: p50/p99 latency at 1 and 32 concurrent clients, the endpoint's own CPU
time per completion (from /proc of the server process), the most completions per
second one endpoint process sustains, and its memory per stored call.

    .venv/bin/python bench/endpoint_overhead.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "endpoint_overhead.json"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Look up the {name} record.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
    for name in ("lookup", "inspect")
]
MESSAGES = [
    {"role": "system", "content": "You are an inspection agent. Follow the procedure."},
    {"role": "user", "content": "Inspect aircraft N123AB and report."},
]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def in_process(n: int, concurrency: int) -> dict[str, float]:
    from mtrl_runtime.chat import ChatRenderer, normalize_messages
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.testing import tiny_tokenizer
    from mtrl_runtime.types import GenerationRequest, SamplingParams

    tok = tiny_tokenizer()
    engine = ScriptedEngine(tok, lambda request, prompt: "DONE")
    ids = tuple(ChatRenderer(tok).encode(ChatRenderer(tok).render(normalize_messages(MESSAGES), TOOLS, True)))
    request = GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=64), rollout_id="r", turn_index=0)
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            await engine.generate(request)
            latencies.append(time.perf_counter() - t0)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "cpu_ms_per_call": cpu / n * 1e3,
        "calls_per_s": n / wall,
    }


async def through_endpoint(url: str, pid: int, n: int, concurrency: int) -> dict[str, float]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 4), timeout=60) as client:
        created = []
        for i in range(n):
            r = await client.post(f"{url}/v1/rollouts", json={"task_id": f"t{i % 50}", "prompt": "inspect"})
            created.append(r.json())
        body = {"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64}
        latencies: list[float] = []
        errors = 0
        queue = list(created)

        async def worker() -> None:
            nonlocal errors
            while queue:
                rollout = queue.pop()
                t0 = time.perf_counter()
                r = await client.post(
                    f"{rollout['base_url']}/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {rollout['token']}"},
                )
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        # end the rollouts (untimed) so memory can be read with nothing live
        for rollout in created:
            await client.post(
                f"{url}/rollouts/{rollout['rollout_id']}/complete",
                json={"status": "completed"},
                headers={"authorization": f"Bearer {rollout['token']}"},
            )
    return {
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "server_cpu_ms_per_call": cpu / n * 1e3,
        "calls_per_s": n / wall,
        "errors": errors,
    }


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    from mtrl_runtime.testing import save_tiny_model

    model_dir = save_tiny_model(tmp / "tiny")
    config = tmp / "bench.yaml"
    config.write_text("core:\n  max_turns: 1000\n")
    port = free_port()
    cmd = [
        sys.executable, "-m", "mtrl_runtime.cli", "serve", "--config", str(config), "--engine", "scripted",
        "--model", str(model_dir), "--run-dir", str(tmp / "run"), "--port", str(port),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode())
    raise TimeoutError("mtrl serve did not start")


async def main(n: int) -> dict:
    results: dict = {"requests_per_setting": n, "machine": f"{os.cpu_count()} cores", "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp))
        try:
            await through_endpoint(url, proc.pid, 200, 8)  # warm-up
            rss_before = rss_bytes(proc.pid)
            for conc in (1, 32):
                base = await in_process(n, conc)
                http = await through_endpoint(url, proc.pid, n, conc)
                results["settings"][f"clients_{conc}"] = {
                    "in_process": base,
                    "endpoint": http,
                    "added_p50_ms": http["p50_ms"] - base["p50_ms"],
                    "added_p99_ms": http["p99_ms"] - base["p99_ms"],
                }
            rss_after = rss_bytes(proc.pid)
            calls = 2 * n
            results["memory"] = {
                "rss_before_mb": rss_before / 2**20,
                "rss_after_mb": rss_after / 2**20,
                "bytes_per_stored_call": (rss_after - rss_before) / calls,
                "calls": calls,
            }
        finally:
            proc.terminate()
            proc.wait(10)
    return results


def report(results: dict) -> None:
    print(f"endpoint overhead, scripted engine, {results['requests_per_setting']} completions per setting")
    print(f"{'clients':>8} {'in-proc p50':>12} {'endpoint p50':>13} {'added p50':>10} {'added p99':>10} "
          f"{'server CPU/call':>16} {'completions/s':>14}")
    for name, s in results["settings"].items():
        print(
            f"{name.split('_')[1]:>8} {s['in_process']['p50_ms']:>10.3f}ms {s['endpoint']['p50_ms']:>11.3f}ms "
            f"{s['added_p50_ms']:>8.3f}ms {s['added_p99_ms']:>8.3f}ms "
            f"{s['endpoint']['server_cpu_ms_per_call']:>14.3f}ms {s['endpoint']['calls_per_s']:>14.0f}"
        )
    one, many = results["settings"]["clients_1"], results["settings"]["clients_32"]
    print(f"goal: added p50 with 1 client <= 1.5 ms: {one['added_p50_ms']:.3f} ms "
          f"(ratio to goal {one['added_p50_ms'] / 1.5:.2f})")
    print(f"goal: >= 500 completions/s: {many['endpoint']['calls_per_s']:.0f}/s "
          f"(ratio to goal {many['endpoint']['calls_per_s'] / 500:.2f})")
    m = results["memory"]
    print(f"memory: {m['rss_before_mb']:.1f} MB -> {m['rss_after_mb']:.1f} MB over {m['calls']} stored calls "
          f"({m['bytes_per_stored_call']:.0f} bytes per call)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    out = asyncio.run(main(args.requests))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2))
    report(out)
