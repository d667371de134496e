"""What the Bedrock Converse paths cost per call, against chat completions answered the same way, in one run.

One ``mtrl serve`` on the scripted engine (the model costs nothing), the
load generator of ``bench/endpoint_overhead.py`` (a raw keep-alive HTTP/1.1
client, one connection per concurrent client). Each call is the first turn
of a fresh rollout with the same conversation (a system prompt, a user
message, two tools). Like is compared with like, in two pairs:

- ``converse`` (``POST /rollouts/{id}/model/{modelId}/converse``, one JSON
  answer) against ``chat`` (``/v1/chat/completions``, not streamed);
- ``converse-stream`` (``.../converse-stream``, Bedrock's event-stream
  framing, token by token) against ``chat-stream`` (``/v1/chat/completions``
  with ``stream: true`` and the usage chunk, Server-Sent Events token by
  token). The scripted engine has no per-token delay, so the events leave
  as fast as the server writes them.

At 1 and 32 clients, each pair runs in ``--rounds`` interleaved rounds
(``_rounds``: the order swapped every round, ``--requests / --rounds`` calls
a run), so drift of the shared machine's load falls on both sides alike.
Reported per protocol: p50/p95 latency and the server's CPU per call (from
/proc, robust to other load), pooled over the rounds, each as a ratio to its
baseline (goal: within 1.3x), and the median and range of the ratios paired
round by round (the spread a single pair of runs would have shown).

    .venv/bin/python bench/bedrock_overhead.py [--requests 1000] [--rounds 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from _machine import load_note, machine_info
from _rounds import Run, interleaved, paired, pooled, report_row
from endpoint_overhead import (
    MESSAGES,
    ROOT,
    TOOLS,
    first_turns,
    start_server,
)

RESULTS = ROOT / "bench" / "results" / "bedrock_overhead.json"
MODEL_ID = "us.anthropic.claude-sonnet-4-20250514-v1:0"
SETTINGS = {"clients_1": 1, "clients_32": 32}
PAIRS = {"converse": "chat", "converse-stream": "chat-stream"}  # protocol -> its baseline
GOAL = 1.3


def requests() -> dict[str, tuple[str, bytes, bytes]]:
    """Per protocol: the path below /rollouts/{id}, the body, and the bytes a whole answer ends with."""
    chat = {"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64}
    chat_stream = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    system = [{"text": m["content"]} for m in MESSAGES if m["role"] == "system"]
    messages = [{"role": m["role"], "content": [{"text": m["content"]}]} for m in MESSAGES if m["role"] != "system"]
    tools = [{"toolSpec": {"name": t["function"]["name"], "description": t["function"]["description"],
                           "inputSchema": {"json": t["function"]["parameters"]}}} for t in TOOLS]
    converse = json.dumps({"messages": messages, "system": system, "toolConfig": {"tools": tools},
                           "inferenceConfig": {"maxTokens": 64}}).encode()
    return {
        "chat": ("/v1/chat/completions", json.dumps(chat).encode(), b"}"),
        "converse": (f"/model/{MODEL_ID}/converse", converse, b"}"),
        "chat-stream": ("/v1/chat/completions", json.dumps(chat_stream).encode(), b"data: [DONE]"),
        # the last event of a ConverseStream answer is `metadata` (usage, latency); its frame ends in a CRC
        "converse-stream": (f"/model/{MODEL_ID}/converse-stream", converse, b"metadata"),
    }


async def measure(port: int, pid: int, protocol: str, n: int, concurrency: int) -> Run:
    """``n`` first turns of ``n`` fresh rollouts in ``protocol``, from ``concurrency`` clients."""
    path, body, end = requests()[protocol]
    if protocol == "converse-stream":
        def ok(status: int, answer: bytes) -> bool:
            return status == 200 and end in last_frame_headers(answer)
    else:
        def ok(status: int, answer: bytes) -> bool:
            return status == 200 and answer.rstrip().endswith(end)
    return await first_turns(port, pid, n, concurrency, path, body, ok)


def last_frame_headers(answer: bytes) -> bytes:
    """The header bytes of an event stream's last frame, b"" unless the frames' lengths tile ``answer`` exactly."""
    at, headers = 0, b""
    while at + 12 <= len(answer):  # prelude: total length, headers length, prelude CRC (big-endian u32 each)
        total, size = int.from_bytes(answer[at:at + 4], "big"), int.from_bytes(answer[at + 4:at + 8], "big")
        if total < 16 or at + total > len(answer):
            return b""
        headers, at = answer[at + 12:at + 12 + size], at + total
    return headers if at == len(answer) else b""


def compared(runs: list[Run], base: list[Run]) -> dict:
    """One protocol's pooled figures, their ratios to its baseline's, and the ratios paired round by round."""
    f, b = pooled(runs), pooled(base)
    return {
        **f,
        "p50_ratio": f["p50_ms"] / b["p50_ms"],
        "p95_ratio": f["p95_ms"] / b["p95_ms"],
        "cpu_ratio": f["server_cpu_ms_per_call"] / b["server_cpu_ms_per_call"],
        "paired_p50_ratio": paired(runs, base, "p50_ms"),
        "paired_cpu_ratio": paired(runs, base, "server_cpu_ms_per_call"),
    }


async def main(n: int, rounds: int) -> dict:
    per_run = max(1, n // rounds)
    load_before = os.getloadavg()
    results: dict = {
        "requests_per_protocol_and_setting": per_run * rounds, "rounds": rounds, "requests_per_run": per_run,
        "engine": "scripted (no model runs)",
        "client": "bench/endpoint_overhead.py's raw asyncio HTTP/1.1 client, keep-alive, one connection per client",
        "pairs": PAIRS, "order": "each pair [baseline, protocol], swapped every round (bench/_rounds.py)",
        "settings": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp))
        try:
            for protocol in requests():  # warm-up: every route's first calls (imports, caches)
                await measure(port, proc.pid, protocol, 200, 8)
            for name, concurrency in SETTINGS.items():
                setting: dict = {"baselines": {}, "protocols": {}}
                for protocol, baseline in PAIRS.items():
                    runs = await interleaved(lambda p: measure(port, proc.pid, p, per_run, concurrency),
                                             [baseline, protocol], rounds)
                    setting["baselines"][baseline] = pooled(runs[baseline])
                    setting["protocols"][protocol] = {"baseline": baseline,
                                                      **compared(runs[protocol], runs[baseline])}
                results["settings"][name] = setting
        finally:
            proc.terminate()
            proc.wait(10)
    load_after = os.getloadavg()
    results["machine"] = machine_info(load_before, load_after, 0, dtype="none (scripted engine: no model runs)")
    results["note"] = load_note(load_before, load_after, "latencies are upper bounds; read the ratios")
    return results


def report(results: dict) -> None:
    m = results["machine"]
    print(f"Bedrock Converse vs chat completions answered alike, scripted engine, "
          f"{results['requests_per_protocol_and_setting']} calls per protocol and setting in {results['rounds']} "
          f"interleaved rounds; {m['cpu_model']}, {m['cpus']} cores, load average {m['loadavg_before'][0]:.1f} "
          f"at start, {m['loadavg_after'][0]:.1f} at end")
    print(f"{'clients':>8} {'protocol':>16} {'p50':>10} {'x base':>7} {'p95':>10} {'x base':>7} {'server CPU/call':>16} "
          f"{'x base':>7} {'errors':>7}   paired by round, median [range]: p50, CPU")
    for name, s in results["settings"].items():
        label = name.removeprefix("clients_")
        for protocol, r in s["protocols"].items():
            print(report_row(label, r["baseline"], s["baselines"][r["baseline"]], 16))
            print(report_row(label, protocol, r, 16))
    every = [(name, p, r) for name, s in results["settings"].items() for p, r in s["protocols"].items()]
    over = [f"{p} at {name.removeprefix('clients_')} client(s): {key} {r[key]:.2f}x"
            for name, p, r in every for key in ("p50_ratio", "p95_ratio", "cpu_ratio") if r[key] > GOAL]
    print(f"goal: within {GOAL}x of the baseline: " + ("met" if not over else "missed: " + "; ".join(over)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000, help="calls per protocol and setting, over all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per pair and setting (see _rounds)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    out = asyncio.run(main(args.requests, args.rounds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    report(out)
