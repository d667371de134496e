"""What each wire protocol's endpoint costs per call, against chat completions in the same run.

One ``mtrl serve`` on the scripted engine (so the model costs nothing), the
same conversation (a system prompt, a user message, two tools) sent as an
OpenAI chat completion, an OpenAI Responses call and an Anthropic Messages
call, each the first turn of a fresh rollout, from 1 and from 32 concurrent
clients. The load generator is ``endpoint_overhead``'s (raw keep-alive
HTTP/1.1, one connection per client). Chat completions is measured before
and after the protocols in each setting; the baseline is the mean of both,
so drift of the shared machine's load shows as the gap between them.
Reported per protocol: p50 latency and the server's CPU per call (from
/proc, robust to other load), each as a ratio to chat completions (goal:
within 1.3x).

    .venv/bin/python bench/protocol_overhead.py [--requests 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from endpoint_overhead import (
    MESSAGES,
    TOOLS,
    first_turns,
    pct,
    start_server,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "protocol_overhead.json"
SYSTEM, USER = MESSAGES[0]["content"], MESSAGES[1]["content"]
BODIES = {
    "chat_completions": ("v1/chat/completions", {"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64}),
    "openai_responses": ("v1/responses", {
        "model": "policy", "instructions": SYSTEM, "input": USER, "max_output_tokens": 64,
        "tools": [{"type": "function", **t["function"]} for t in TOOLS],
    }),
    "anthropic_messages": ("v1/messages", {
        "model": "policy", "system": SYSTEM, "messages": [{"role": "user", "content": USER}], "max_tokens": 64,
        "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOLS],
    }),
}
ORDER = ["chat_completions", "openai_responses", "anthropic_messages", "chat_completions"]
SETTINGS = {"clients_1": 1, "clients_32": 32}


async def measure(port: int, pid: int, protocol: str, n: int, concurrency: int) -> dict[str, float]:
    """``n`` first turns of ``n`` fresh rollouts in ``protocol``, from ``concurrency`` clients."""
    path, payload = BODIES[protocol]
    body = json.dumps(payload).encode()
    run = await first_turns(port, pid, n, concurrency, f"/{path}", body, lambda status, _: status == 200)
    latencies, wall, cpu, errors = run["latencies"], run["wall_s"], run["cpu_s"], run["errors"]
    return {"p50_ms": pct(latencies, 0.5) * 1e3, "p99_ms": pct(latencies, 0.99) * 1e3,
            "server_cpu_ms_per_call": cpu / n * 1e3, "calls_per_s": n / wall, "errors": errors}


async def main(n: int) -> dict:
    results: dict = {"requests_per_run": n, "machine": f"{os.cpu_count()} cores",
                     "dtype": "none (scripted engine: no model runs)", "loadavg_start": os.getloadavg(),
                     "order": ORDER, "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp))
        try:
            for protocol in BODIES:  # warm-up: every route's first calls (imports, caches)
                await measure(port, proc.pid, protocol, 200, 8)
            for name, concurrency in SETTINGS.items():
                runs = [(protocol, await measure(port, proc.pid, protocol, n, concurrency)) for protocol in ORDER]
                chat = [r for p, r in runs if p == "chat_completions"]
                base = {k: (chat[0][k] + chat[1][k]) / 2 for k in ("p50_ms", "server_cpu_ms_per_call")}
                setting: dict = {"chat_completions_runs": chat, "baseline": base, "protocols": {}}
                for protocol, r in runs:
                    if protocol != "chat_completions":
                        setting["protocols"][protocol] = {
                            **r,
                            "p50_ratio": r["p50_ms"] / base["p50_ms"],
                            "cpu_ratio": r["server_cpu_ms_per_call"] / base["server_cpu_ms_per_call"],
                        }
                results["settings"][name] = setting
        finally:
            proc.terminate()
            proc.wait(10)
    results["loadavg_end"] = os.getloadavg()
    return results


def report(results: dict) -> None:
    print(f"protocol overhead vs chat completions, scripted engine, {results['requests_per_run']} calls per run "
          f"(load average {results['loadavg_start'][0]:.1f} at start, {results['loadavg_end'][0]:.1f} at end)")
    print(f"{'clients':>8} {'protocol':>20} {'p50':>9} {'x chat':>7} {'server CPU/call':>16} {'x chat':>7} {'errors':>7}")
    for name, s in results["settings"].items():
        label = name.removeprefix("clients_")
        chat = s["chat_completions_runs"]
        print(f"{label:>8} {'chat_completions':>20} {s['baseline']['p50_ms']:>7.3f}ms {'1.00':>7} "
              f"{s['baseline']['server_cpu_ms_per_call']:>14.3f}ms {'1.00':>7} {chat[0]['errors'] + chat[1]['errors']:>7}"
              f"   (runs before/after: {chat[0]['server_cpu_ms_per_call']:.3f}/{chat[1]['server_cpu_ms_per_call']:.3f} ms CPU)")
        for protocol, r in s["protocols"].items():
            print(f"{label:>8} {protocol:>20} {r['p50_ms']:>7.3f}ms {r['p50_ratio']:>7.2f} "
                  f"{r['server_cpu_ms_per_call']:>14.3f}ms {r['cpu_ratio']:>7.2f} {r['errors']:>7}")
    worst = max(r["cpu_ratio"] for s in results["settings"].values() for r in s["protocols"].values())
    print(f"goal: server CPU per call within 1.3x of chat completions: worst {worst:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    out = asyncio.run(main(args.requests))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    report(out)
