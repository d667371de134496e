"""Time to first token through the policy endpoint: streamed (tokens as decoded) against not streamed.

Side by side in one run, on the hf engine with SmolLM2-135M-Instruct, one
rollout per request, served on loopback as in training (``start_server``):

1. streamed: ``stream: true``; time to the first byte (the headers and the
   role chunk, sent once the call is accepted), to the first text delta,
   and to the end;
2. not streamed: the same request (same seed, so the same tokens); its
   first byte is the whole answer.

The requests alternate, so load on the shared machine hits both sides
alike. Also reported: the engine's mean decode step (the floor a first
delta cannot beat by much: prefill + one step + the endpoint's overhead).

``--protocol converse-stream`` measures Bedrock's pair instead:
``converse-stream`` (AWS event-stream framing, parsed with botocore's own
``EventStreamBuffer``; first text = the first ``contentBlockDelta`` with
text or reasoning) against ``converse``; the tokens are compared from the
turns the store recorded.

    .venv/bin/python bench/streaming_ttft.py [--rounds 6] [--max-tokens 96] [--protocol chat|converse-stream]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from _machine import load_note, machine_info, model_dtype

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.server import create_app, start_server
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import Task

RESULTS = Path(__file__).resolve().parent / "results" / "streaming_ttft.json"
CONVERSE_RESULTS = RESULTS.with_name("streaming_ttft.converse-stream.json")
MESSAGES = [{"role": "user", "content": "Write a short story about an aircraft inspector who finds something odd."}]


def streamed(client: httpx.Client, url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    first_byte = first_text = None
    ids: list[int] = []
    with client.stream("POST", url, json={**body, "stream": True}, headers={"authorization": f"Bearer {token}"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            now = time.perf_counter() - started
            if first_byte is None:
                first_byte = now
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"]
            if first_text is None and (delta.get("content") or delta.get("reasoning_content")):
                first_text = now
            ids = choice.get("token_ids") or ids
    return {"first_byte_s": first_byte, "first_text_s": first_text, "total_s": time.perf_counter() - started,
            "completion_ids": ids}


def whole(client: httpx.Client, url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    r = client.post(url, json=body, headers={"authorization": f"Bearer {token}"})
    r.raise_for_status()
    total = time.perf_counter() - started
    return {"first_byte_s": total, "first_text_s": total, "total_s": total,
            "completion_ids": r.json()["choices"][0]["token_ids"]}


def converse_streamed(client: httpx.Client, url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    from botocore.eventstream import EventStreamBuffer  # the parser boto3 reads Bedrock's stream with

    started = time.perf_counter()
    first_byte = first_text = None
    buffer = EventStreamBuffer()
    with client.stream("POST", url + "-stream", json=body, headers={"authorization": f"Bearer {token}"}) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            now = time.perf_counter() - started
            if first_byte is None:
                first_byte = now
            buffer.add_data(chunk)
            for message in buffer:
                if first_text is None and message.headers.get(":event-type") == "contentBlockDelta":
                    delta = json.loads(message.payload)["delta"]
                    if delta.get("text") or delta.get("reasoningContent"):
                        first_text = now
    return {"first_byte_s": first_byte, "first_text_s": first_text, "total_s": time.perf_counter() - started}


def converse_whole(client: httpx.Client, url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    r = client.post(url, json=body, headers={"authorization": f"Bearer {token}"})
    r.raise_for_status()
    total = time.perf_counter() - started
    return {"first_byte_s": total, "first_text_s": total, "total_s": total}


def request(protocol: str, rollout_id: str, max_tokens: int, seed: int) -> tuple[str, dict[str, Any], Any, Any]:
    """The path, body and the (streamed, whole) callers of one request of ``protocol``."""
    if protocol == "converse-stream":
        body = {"messages": [{"role": "user", "content": [{"text": MESSAGES[0]["content"]}]}],
                "inferenceConfig": {"maxTokens": max_tokens, "temperature": 1.0},
                "additionalModelRequestFields": {"seed": seed}}
        return f"/rollouts/{rollout_id}/model/m/converse", body, converse_streamed, converse_whole
    body = {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed,
            "return_token_ids": True}
    return f"/rollouts/{rollout_id}/v1/chat/completions", body, streamed, whole


def main(args: argparse.Namespace) -> dict[str, Any]:
    engine = HFEngine(resolve_model("smollm2-135m"), dtype=args.dtype, num_threads=args.threads,
                      prefix_cache_tokens=0)  # every request prefills its whole prompt, as a first turn does
    folder = Path(tempfile.mkdtemp(prefix="mtrl-ttft-"))
    store = SQLiteStore(folder / "store.db")
    coordinator = Coordinator(engine, store, MtrlConfig())
    handle = start_server(create_app(coordinator), "127.0.0.1", 0)
    load_before = os.getloadavg()
    sides: dict[str, list[dict[str, Any]]] = {"streamed": [], "whole": []}
    same = True
    try:
        with httpx.Client(timeout=600) as client:
            for i in range(args.rounds + 1):  # round 0 warms up and is not counted
                got = {}
                for name in ("streamed", "whole") if i % 2 else ("whole", "streamed"):
                    rollout = coordinator.create_rollout(Task(id=f"t{i}", prompt="q"))
                    path, body, *calls = request(args.protocol, rollout.rollout_id, args.max_tokens, 1000 + i)
                    got[name] = calls[name == "whole"](client, handle.url + path, rollout.token, body)
                    # the tokens the turn recorded (chat completions also returns them, compared below)
                    stored = list(coordinator.recorded(rollout.rollout_id).turns[0].completion_ids)
                    assert got[name].setdefault("completion_ids", stored) == stored, "returned ids differ from the turn's"
                same = same and got["streamed"].pop("completion_ids") == got["whole"].pop("completion_ids")
                if i:
                    for name in sides:
                        sides[name].append(got[name])
        stats = engine.stats
        step_s = stats.decode_s / max(stats.decode_passes, 1)
        dtype = model_dtype(engine.model)
    finally:
        handle.stop()
        store.close()
    load_after = os.getloadavg()

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in sides[name]), 4)

    summary = {name: {key: median(name, key) for key in ("first_byte_s", "first_text_s", "total_s")} for name in sides}
    return {
        "benchmark": "streaming_ttft",
        "protocol": args.protocol,
        "model": f"SmolLM2-135M-Instruct ({dtype}), hf engine, prefix cache off",
        "workload": {"rounds": args.rounds, "max_tokens": args.max_tokens, "sampling": "temperature 1, seeded",
                     "prompt": MESSAGES[0]["content"]},
        "machine": machine_info(load_before, load_after, args.threads or torch.get_num_threads(), dtype=dtype),
        "note": load_note(load_before, load_after, "times are upper bounds"),
        "same_tokens": same,
        "decode_step_s": round(step_s, 4),
        "median": summary,
        "ttft_ratio_whole_over_streamed": round(summary["whole"]["first_text_s"] / summary["streamed"]["first_text_s"], 1),
        "streamed_ttft_over_its_total": round(summary["streamed"]["first_text_s"] / summary["streamed"]["total_s"], 3),
        "rounds": sides,
    }


def report(data: dict[str, Any]) -> None:
    m = data["median"]
    print(f"protocol: {data['protocol']}")
    for name in ("streamed", "whole"):
        print(f"{name:>9}: first byte {m[name]['first_byte_s']:.3f} s, first text {m[name]['first_text_s']:.3f} s, "
              f"total {m[name]['total_s']:.3f} s")
    print(f"time to first text: {data['ttft_ratio_whole_over_streamed']}x shorter streamed; streamed TTFT is "
          f"{data['streamed_ttft_over_its_total']:.1%} of its full latency; decode step {data['decode_step_s'] * 1000:.1f} ms; "
          f"same tokens: {data['same_tokens']}")
    mach = data["machine"]
    print(f"{mach['cpus']} CPUs, {mach['engine_threads']} engine threads, load {mach['loadavg_before']} -> "
          f"{mach['loadavg_after']}: {data['note']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--protocol", choices=("chat", "converse-stream"), default="chat",
                        help="chat completions (stream: true vs not) or Bedrock converse-stream vs converse")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.out = args.out or (CONVERSE_RESULTS if args.protocol == "converse-stream" else RESULTS)
    data = main(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    report(data)
