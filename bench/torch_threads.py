"""hf engine decoding after torch work ran on the engine's worker thread vs on a thread pool thread.

torch's CPU kernels run in an OpenMP team per calling thread, and a team
lives as long as its thread (see ``engines/hf/_worker.py``). The same work is
done in two fresh processes, one after the other (the effect lasts for the
life of a process, so the two sides cannot share one):

- ``worker``: the engine loads a LoRA adapter (its ``load_adapter`` runs the
  load and the fold on the worker thread), then decodes;
- ``pool``: the same, then the adapter is unfolded and folded again on a
  thread of asyncio's default pool (``asyncio.to_thread``), as the
  shared-weights update and the adapter load did before they moved to the
  worker; then it decodes.

Each decodes 8 short prompts x 64 tokens (SmolLM2-135M, bf16, eos off,
fixed seeds) ``--rounds`` times; the best round counts. Both build the
engine and the adapter on a thread that ends before decoding starts, so
the thread pool's fold is the one difference.

    python bench/torch_threads.py [--rounds 3] [--threads 2]

Writes bench/results/torch_threads.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _machine import load_note, machine_info

MODES = ("worker", "pool")


def on_short_thread(fn: Any) -> Any:
    """``fn()`` on a thread that ends (its OpenMP team ends with it)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


async def child(mode: str, rounds: int, threads: int) -> dict[str, Any]:
    from _prompts import QUESTIONS
    from lora_fold import save_adapter

    from mtrl_runtime.chat import ChatRenderer
    from mtrl_runtime.engines import HFEngine, resolve_model
    from mtrl_runtime.types import GenerationRequest, SamplingParams

    folder = resolve_model("smollm2-135m")
    engine = on_short_thread(lambda: HFEngine(folder, dtype="bf16", eos_token_ids=(), num_threads=threads))
    renderer = ChatRenderer(engine.tokenizer)
    requests = [GenerationRequest(tuple(renderer.encode(renderer.render([{"role": "user", "content": q}], None))),
                                  SamplingParams(max_tokens=64, seed=i)) for i, q in enumerate(QUESTIONS)]
    with tempfile.TemporaryDirectory() as tmp:
        adapter = on_short_thread(lambda: save_adapter(folder, Path(tmp) / "adapter"))
        await engine.load_adapter(str(adapter), 1)
    if mode == "pool":
        def refold() -> None:
            with engine.weights_lock:
                engine.lora_fold.unfold()
                engine.lora_fold.fold()

        await asyncio.to_thread(refold)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        generations = await asyncio.gather(*(engine.generate(r) for r in requests))
        times.append(round(time.perf_counter() - started, 2))
    await engine.close()
    tokens = sum(len(g.completion_ids) for g in generations)
    return {"mode": mode, "seconds": times, "best_s": min(times), "tokens": tokens,
            "ms_per_decode_step": round(1000 * min(times) / 64, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "torch_threads.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.child, args.rounds, args.threads))))
        return
    load_before = os.getloadavg()
    sides = {}
    for mode in MODES:
        command = [sys.executable, __file__, "--child", mode, "--rounds", str(args.rounds), "--threads", str(args.threads)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        sides[mode] = json.loads(out.strip().splitlines()[-1])
        print(f"{mode}: best {sides[mode]['best_s']} s ({sides[mode]['ms_per_decode_step']} ms a decode step), "
              f"rounds {sides[mode]['seconds']}", flush=True)
    load_after = os.getloadavg()
    ratio = round(sides["pool"]["best_s"] / sides["worker"]["best_s"], 2)
    result = {
        "benchmark": "torch_threads",
        "model": "SmolLM2-135M-Instruct (bf16), LoRA r16 folded, 8 prompts x 64 tokens",
        "machine": machine_info(load_before, load_after, args.threads, dtype="bf16"),
        "note": load_note(load_before, load_after, "times are upper bounds"),
        "sides": sides,
        "speedup_worker_vs_pool": ratio,
    }
    print(f"torch work on the worker thread: {ratio}x faster decoding than after torch work on a pool thread")
    print(result["note"])
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
