"""What each wire protocol's endpoint costs per call, against chat completions in the same run.

One ``mtrl serve`` on the scripted engine (so the model costs nothing), the
same conversation (a system prompt, a user message, two tools) sent as an
OpenAI chat completion, an OpenAI Responses call, an Anthropic Messages
call and a Gemini generateContent call, each the first turn of a fresh rollout, from 1 and from 32 concurrent
clients. The load generator is ``endpoint_overhead``'s (raw keep-alive
HTTP/1.1, one connection per client). In each setting the three protocols
run in ``--rounds`` interleaved rounds (``_rounds``: the order rotated every
round, ``--requests / --rounds`` calls a run), so drift of the shared
machine's load falls on all three alike. Reported per protocol: p50/p95
latency and the server's CPU per call (from /proc, robust to other load),
pooled over the rounds, each as a ratio to chat completions (goal: within
1.3x), and the median and range of the ratios paired round by round (the
spread a single pair of runs would have shown).

    .venv/bin/python bench/protocol_overhead.py [--requests 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from _rounds import Run, interleaved, paired, pooled, report_row
from endpoint_overhead import (
    MESSAGES,
    TOOLS,
    first_turns,
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
    "gemini": ("v1beta/models/policy:generateContent", {
        "systemInstruction": {"parts": [{"text": SYSTEM}]}, "contents": [{"role": "user", "parts": [{"text": USER}]}],
        "generationConfig": {"maxOutputTokens": 64},
        "tools": [{"functionDeclarations": [{"name": t["function"]["name"], "description": t["function"]["description"],
                                             "parametersJsonSchema": t["function"]["parameters"]} for t in TOOLS]}],
    }),
}
SETTINGS = {"clients_1": 1, "clients_32": 32}


async def measure(port: int, pid: int, protocol: str, n: int, concurrency: int) -> Run:
    """``n`` first turns of ``n`` fresh rollouts in ``protocol``, from ``concurrency`` clients."""
    path, payload = BODIES[protocol]
    body = json.dumps(payload).encode()
    return await first_turns(port, pid, n, concurrency, f"/{path}", body, lambda status, _: status == 200)


async def main(n: int, rounds: int) -> dict:
    per_run = max(1, n // rounds)
    results: dict = {"requests_per_protocol_and_setting": per_run * rounds, "rounds": rounds, "requests_per_run": per_run,
                     "machine": f"{os.cpu_count()} cores", "dtype": "none (scripted engine: no model runs)",
                     "loadavg_start": os.getloadavg(), "order": f"{list(BODIES)}, rotated by one every round",
                     "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp))
        try:
            for protocol in BODIES:  # warm-up: every route's first calls (imports, caches)
                await measure(port, proc.pid, protocol, 200, 8)
            for name, concurrency in SETTINGS.items():
                runs = await interleaved(lambda p: measure(port, proc.pid, p, per_run, concurrency), list(BODIES), rounds)
                chat = runs["chat_completions"]
                base = pooled(chat)
                setting: dict = {"baseline": base, "protocols": {}}
                for protocol, r in runs.items():
                    if protocol != "chat_completions":
                        f = pooled(r)
                        setting["protocols"][protocol] = {
                            **f,
                            "p50_ratio": f["p50_ms"] / base["p50_ms"],
                            "p95_ratio": f["p95_ms"] / base["p95_ms"],
                            "cpu_ratio": f["server_cpu_ms_per_call"] / base["server_cpu_ms_per_call"],
                            "paired_p50_ratio": paired(r, chat, "p50_ms"),
                            "paired_cpu_ratio": paired(r, chat, "server_cpu_ms_per_call"),
                        }
                results["settings"][name] = setting
        finally:
            proc.terminate()
            proc.wait(10)
    results["loadavg_end"] = os.getloadavg()
    return results


def report(results: dict) -> None:
    print(f"protocol overhead vs chat completions, scripted engine, {results['requests_per_protocol_and_setting']} calls "
          f"per protocol and setting in {results['rounds']} interleaved rounds "
          f"(load average {results['loadavg_start'][0]:.1f} at start, {results['loadavg_end'][0]:.1f} at end)")
    print(f"{'clients':>8} {'protocol':>20} {'p50':>10} {'x chat':>7} {'p95':>10} {'x chat':>7} {'server CPU/call':>16} "
          f"{'x chat':>7} {'errors':>7}   paired by round, median [range]: p50, CPU")
    for name, s in results["settings"].items():
        label = name.removeprefix("clients_")
        print(report_row(label, "chat_completions", s["baseline"], 20))
        for protocol, r in s["protocols"].items():
            print(report_row(label, protocol, r, 20))
    every = [r for s in results["settings"].values() for r in s["protocols"].values()]
    print(f"goal: within 1.3x of chat completions: worst server CPU per call {max(r['cpu_ratio'] for r in every):.2f}x, "
          f"worst pooled p50 {max(r['p50_ratio'] for r in every):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="calls per protocol and setting, over all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per setting (see _rounds)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    out = asyncio.run(main(args.requests, args.rounds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    report(out)
