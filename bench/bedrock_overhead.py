"""What the Bedrock Converse paths cost per call, against chat completions, side by side in one run.

One ``mtrl serve`` on the scripted engine (the model costs nothing), the
load generator of ``bench/endpoint_overhead.py`` (a raw keep-alive HTTP/1.1
client, one connection per concurrent client). Each call is the first turn
of a fresh rollout with the same conversation (a system prompt, a user
message, two tools), sent as:

- ``chat``: ``POST /rollouts/{id}/v1/chat/completions`` (the baseline);
- ``converse``: ``POST /rollouts/{id}/model/{modelId}/converse``;
- ``converse-stream``: ``POST /rollouts/{id}/model/{modelId}/converse-stream``
  (Bedrock's event-stream framing, encoded from the finished reply).

At 1 and 32 clients, each protocol runs twice, in alternating order, and the
two runs are pooled, so slow drift of a shared machine falls on all three.
Reported per protocol: p50/p99 latency, the server's CPU per call (from
/proc, robust to other load), calls per second; and each Converse path's
ratio to chat (goal: within 1.3x).

    .venv/bin/python bench/bedrock_overhead.py [--requests 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from endpoint_overhead import (  # noqa: E402  (the shared load generator)
    MESSAGES,
    ROOT,
    TOOLS,
    first_turns,
    pct,
    start_server,
)

RESULTS = ROOT / "bench" / "results" / "bedrock_overhead.json"
MODEL_ID = "us.anthropic.claude-sonnet-4-20250514-v1:0"
CLIENTS = {"clients_1": 1, "clients_32": 32}
GOAL = 1.3


def bodies() -> dict[str, tuple[str, bytes, bytes]]:
    """Per protocol: the path below /rollouts/{id}, the body, and the bytes a whole answer ends with or holds."""
    chat = {"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64}
    system = [{"text": m["content"]} for m in MESSAGES if m["role"] == "system"]
    messages = [{"role": m["role"], "content": [{"text": m["content"]}]} for m in MESSAGES if m["role"] != "system"]
    tools = [{"toolSpec": {"name": t["function"]["name"], "description": t["function"]["description"],
                           "inputSchema": {"json": t["function"]["parameters"]}}} for t in TOOLS]
    converse = {"messages": messages, "system": system, "toolConfig": {"tools": tools},
                "inferenceConfig": {"maxTokens": 64}}
    return {
        "chat": ("/v1/chat/completions", json.dumps(chat).encode(), b"}"),
        "converse": (f"/model/{MODEL_ID}/converse", json.dumps(converse).encode(), b"}"),
        "converse-stream": (f"/model/{MODEL_ID}/converse-stream", json.dumps(converse).encode(), b"metadata"),
    }


async def run_protocol(port: int, pid: int, n: int, concurrency: int, path: str, body: bytes, marker: bytes) -> dict:
    """``n`` first turns of ``n`` fresh rollouts on one protocol; latencies and the server's CPU time."""
    run = await first_turns(port, pid, n, concurrency, path, body,
                            lambda status, answer: status == 200 and marker in answer[-400:])
    return {key: run[key] for key in ("latencies", "cpu_s", "wall_s", "errors")}


def summary(runs: list[dict]) -> dict:
    latencies = [x for r in runs for x in r["latencies"]]
    calls = len(latencies)
    return {
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "server_cpu_ms_per_call": sum(r["cpu_s"] for r in runs) / calls * 1e3,
        "calls_per_s": calls / sum(r["wall_s"] for r in runs),
        "calls": calls,
        "errors": sum(r["errors"] for r in runs),
    }


async def main(n: int) -> dict:
    results: dict = {
        "requests_per_protocol_and_setting": 2 * n,
        "machine": f"{os.cpu_count()} cores",
        "dtype": "none (scripted engine: no model runs)",
        "engine": "scripted (no model runs)",
        "client": "bench/endpoint_overhead.py's raw asyncio HTTP/1.1 client, keep-alive, one connection per client",
        "loadavg_start": os.getloadavg(),
        "settings": {},
    }
    protocols = bodies()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp))
        try:
            for name, (path, body, marker) in protocols.items():  # warm-up: every path's code and caches
                await run_protocol(port, proc.pid, 200, 8, path, body, marker)
            for setting, clients in CLIENTS.items():
                runs: dict[str, list[dict]] = {name: [] for name in protocols}
                for order in (list(protocols), list(reversed(protocols))):
                    for name in order:
                        path, body, marker = protocols[name]
                        runs[name].append(await run_protocol(port, proc.pid, n, clients, path, body, marker))
                figures = {name: summary(r) for name, r in runs.items()}
                chat = figures["chat"]
                for name in ("converse", "converse-stream"):
                    f = figures[name]
                    f["ratio_to_chat"] = {
                        "server_cpu_per_call": f["server_cpu_ms_per_call"] / chat["server_cpu_ms_per_call"],
                        "p50_latency": f["p50_ms"] / chat["p50_ms"],
                        "calls_per_s": chat["calls_per_s"] / f["calls_per_s"],  # > 1: slower than chat
                    }
                results["settings"][setting] = figures
        finally:
            proc.terminate()
            proc.wait(10)
    results["loadavg_end"] = os.getloadavg()
    return results


def report(results: dict) -> None:
    print(f"Bedrock Converse vs chat completions, scripted engine, {results['requests_per_protocol_and_setting']} "
          f"calls per protocol and setting (load average {results['loadavg_start'][0]:.1f} at start, "
          f"{results['loadavg_end'][0]:.1f} at end)")
    print(f"{'clients':>8} {'protocol':>16} {'p50':>9} {'p99':>9} {'server CPU/call':>16} {'calls/s':>8} "
          f"{'CPU ratio':>10} {'p50 ratio':>10} {'1/throughput ratio':>19}")
    for setting, figures in results["settings"].items():
        for name, f in figures.items():
            r = f.get("ratio_to_chat")
            ratios = (f"{r['server_cpu_per_call']:>10.2f} {r['p50_latency']:>10.2f} {r['calls_per_s']:>19.2f}"
                      if r else f"{'':>10} {'':>10} {'':>19}")
            print(f"{setting.removeprefix('clients_'):>8} {name:>16} {f['p50_ms']:>7.3f}ms {f['p99_ms']:>7.3f}ms "
                  f"{f['server_cpu_ms_per_call']:>14.3f}ms {f['calls_per_s']:>8.0f} {ratios}"
                  + (f"  ({f['errors']} errors)" if f["errors"] else ""))
    worst = max(f["ratio_to_chat"]["server_cpu_per_call"] for figures in results["settings"].values()
                for f in figures.values() if "ratio_to_chat" in f)
    print(f"goal: server CPU per Converse call within {GOAL}x of chat completions: worst {worst:.2f}x "
          f"({'met' if worst <= GOAL else 'missed'})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="calls per protocol, setting and round (2 rounds)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    out = asyncio.run(main(args.requests))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    report(out)
