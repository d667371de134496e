"""The GPU check (issue 22 item 6): the hf engine decoding and LoRA training steps on Qwen3-shaped models.

For each ``--shapes`` entry (``tiny``: hidden 64, 2 layers, the test
tokenizer's vocab; ``0.6b``, ``1.7b``, ``4b``, ``8b``: Qwen3's published
configurations, ``bench/scaling_memory.QWEN3``) a fresh process builds the
model from its configuration with random weights on the device, in the
engine's dtype (``--dtype auto``: bf16 on CUDA and on a CPU with native bf16),
and runs mtrl's in-process setup: the hf engine (``HFEngine.from_objects``)
serving the model and a LoRA policy (``build_policy``, rank 32 on the seven
projections) training that same model object (``SharedWeights``: the step
unfolds the engine's folded LoRA, trains, folds again). It reports:

- decode tokens/s: ``--batch`` requests of ``--context`` random prompt tokens,
  each decoding ``--new-tokens`` (no eos, no prefix cache), sent together so
  they decode as one batch: the tokens the engine's decode passes sampled over
  the seconds it spent in them (``engine.stats``: ``rows_decoded / decode_s``);
  prefill tokens/s from a call with ``max_tokens=1`` on other prompts;
- training tokens/s: ``PolicyUpdate.step`` over ``--rows`` samples of
  ``--length`` tokens whose last ``--trained`` carry the loss (its own
  ``train/step_seconds``), after ``--warmup`` untimed steps;
- peak memory of each phase: ``torch.cuda.max_memory_allocated`` (reset before
  the phase; weights included) on CUDA, the process's peak RSS on CPU
  (``ru_maxrss``: the peak so far, so the training figure includes decoding's);
- MFU: model FLOPs over the device's dense bf16 peak (``PEAK_BF16``: H100,
  H200, A100; null with the reason elsewhere). Model FLOPs per token: 2·N
  per forward token (N: the matmul weights of the decoder and the LM head;
  the embedding lookup is not a matmul) plus attention 4·layers·heads·head_dim
  per attended position; a training token counts 3 forwards (6·N: the usual
  convention, though LoRA skips the frozen weights' gradients), the head only
  at trained positions (the trainer projects only those) and, causal,
  (length + 1) / 2 attended positions on average. Recomputation under
  gradient checkpointing is not counted (model FLOPs, not hardware FLOPs);
- the engine/trainer logprob gap: the engine's sampled-token logprobs of the
  decode call against the trainer's recomputation of the same tokens
  (``PolicyUpdate.trained_logprobs``, LoRA unfolded as the trainer sees it):
  approx KL (k3, as ``train/approx_kl``) and the largest absolute difference,
  before the first step (LoRA B = 0) and after the timed steps (the engine
  serving the trained LoRA folded into its bf16 weights);
- TRL's GRPOTrainer on the same shape: only where ``trl`` is importable, and
  not written yet: the record says so (``bench/trl_vs_mtrl.py`` compares the
  two on CPU with SmolLM2-135M).

A shape that does not fit (CUDA out of memory) is recorded with the error and
the next one runs. Imports only torch, transformers, peft, tokenizers and
mtrl_runtime's engine and training modules (no FastAPI, MLflow or vLLM), as
on the lent GPU machines.

    python bench/gpu.py [--shapes 0.6b,1.7b,8b] [--device cuda] [--batch 32] [--context 1024] [--new-tokens 128]
                        [--rows 8] [--length 2048] [--trained 1536] [--warmup 1] [--steps 2] [--out PATH]
    python bench/gpu.py --shapes tiny,0.6b          # on a CPU: smaller defaults (see DEFAULTS)

Writes bench/results/gpu_<device>.json (``cpu``, or the GPU's name).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _machine import device_info, load_note, machine_info
from scaling_memory import QWEN3, qwen3

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"tiny": None, **{name.lower(): name for name in QWEN3}}  # None: built from the test tokenizer
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True)
# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets; first match of the device name wins
PEAK_BF16 = (("H200", 989e12), ("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12))
DEFAULTS = {  # per device type: what a step of each phase runs unless a flag says otherwise
    "cuda": {"batch": 32, "context": 1024, "new_tokens": 128, "rows": 8, "length": 2048, "trained": 1536,
             "warmup": 1, "steps": 2},
    "cpu": {"batch": 4, "context": 128, "new_tokens": 16, "rows": 2, "length": 256, "trained": 192,
            "warmup": 0, "steps": 1},
}
LORA_RANK, LORA_ALPHA = 32, 64


def peak_flops(device: str, dtype: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s of ``device`` in ``dtype``, None) or (None, why there is no figure)."""
    info = device_info(device)
    if info["type"] != "cuda":
        return None, f"no peak-FLOPs figure for a {info['type']} device: MFU is given for CUDA devices only"
    return gpu_peak(info["name"], dtype)


def gpu_peak(name: str, dtype: str) -> tuple[float | None, str | None]:
    """The dense peak of the GPU called ``name`` (``torch.cuda.get_device_name``) from ``PEAK_BF16``."""
    if dtype != "bf16":
        return None, f"the peak table holds dense bf16 figures only; this run computed in {dtype}"
    for key, peak in PEAK_BF16:
        if key.lower() in name.lower():
            return peak, None
    return None, f"{name!r} is not in PEAK_BF16 ({', '.join(k for k, _ in PEAK_BF16)}): add its dense bf16 peak"


def model_flops(model: Any) -> dict[str, float]:
    """N (matmul weights of the decoder and the head) and the attention factor 4·layers·heads·head_dim."""
    config = model.config
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # tied weights counted once
    head = config.vocab_size * config.hidden_size
    body = total - embedding.numel()  # the decoder (norms are a rounding error)
    if config.tie_word_embeddings:
        total_matmul = body + head
    else:
        total_matmul = body  # the untied head is a parameter of its own, already in body
        body -= head
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"params": float(total), "matmul_params": float(total_matmul), "body": float(body), "head": float(head),
            "attention": 4.0 * config.num_hidden_layers * config.num_attention_heads * head_dim}


def build_model(shape: str, tokenizer: Any, device: str, dtype: str) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if SHAPES[shape] is None:
        config = Qwen3Config(vocab_size=len(tokenizer), **TINY)
    else:
        config = qwen3(QWEN3[SHAPES[shape]])
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dtype]
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # initialise in the target dtype: an 8B fp32 copy would not fit beside it
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


class Memory:
    """Peak memory of a phase: CUDA's allocator peak (reset at ``start``), or the process's peak RSS."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch, self.device = torch, torch.device(device)

    def start(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gb(self) -> float:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
            return round(self.torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, 2)


def prompts(rng: random.Random, count: int, length: int, vocab: int) -> list[tuple[int, ...]]:
    return [tuple(rng.randrange(3, vocab) for _ in range(length)) for _ in range(count)]


def gap(engine_logprobs: list[tuple[float, ...]], trainer_logprobs: list[tuple[float, ...]]) -> dict[str, float]:
    """approx KL (k3 of KL(engine || trainer), as the loss's ``approx_kl``) and the largest |difference|."""
    pairs = [(e, t) for es, ts in zip(engine_logprobs, trainer_logprobs, strict=True)
             for e, t in zip(es, ts, strict=True)]
    log_r = [t - e for e, t in pairs]
    return {"approx_kl": sum(math.exp(x) - 1.0 - x for x in log_r) / len(log_r),
            "max_abs": max(abs(x) for x in log_r), "tokens": len(log_r)}


def training_samples(args: argparse.Namespace, vocab: int) -> list[Any]:
    """``--rows`` samples of ``--length`` random tokens, the last ``--trained`` trained (as bench/update_memory)."""
    from mtrl_runtime.types import Sample

    rng = random.Random(1)
    out = []
    for i in range(args.rows):
        ids = tuple(rng.randrange(3, vocab) for _ in range(args.length))
        mask = tuple([0] * (args.length - args.trained) + [1] * args.trained)
        out.append(Sample(
            rollout_id=f"r{i}", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
            behaviour_logprobs_T=tuple(-12.0 if m else 0.0 for m in mask),
            advantages_T=tuple((1.0 if i % 2 else -1.0) if m else 0.0 for m in mask),
            policy_version_T=tuple(0 if m else -1 for m in mask),
        ))
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One shape, in this process (the child): build, decode, gap, train, gap again."""
    import torch

    from mtrl_runtime.engines.hf import HFEngine, auto_dtype
    from mtrl_runtime.testing import tiny_tokenizer
    from mtrl_runtime.training import PolicyUpdate, SharedWeights, UpdateSettings, build_policy
    from mtrl_runtime.types import GenerationRequest, Sample, SamplingParams

    device = args.device
    if torch.device(device).type == "cpu":
        torch.set_num_threads(args.threads)
    dtype = auto_dtype(device) if args.dtype == "auto" else args.dtype
    tokenizer = tiny_tokenizer()
    memory = Memory(device)
    started = time.perf_counter()
    model = build_model(args.child, tokenizer, device, dtype)
    flops = model_flops(model)
    build_s = time.perf_counter() - started
    vocab = model.config.vocab_size
    engine = HFEngine.from_objects(
        model, tokenizer, max_batch_size=args.batch, max_prefill_tokens=args.batch * args.context, eos_token_ids=(),
        num_threads=args.threads if torch.device(device).type == "cpu" else None, prefix_cache_tokens=0)
    policy = build_policy(engine.model, tokenizer, rank=LORA_RANK, alpha=LORA_ALPHA)
    precision = "bf16" if dtype == "bf16" else "fp32"
    update = PolicyUpdate(policy, UpdateSettings(precision=precision, learning_rate=args.learning_rate,
                                                 micro_batch_tokens=args.micro_batch_tokens),
                          weights_lock=engine.weights_lock)
    weights = SharedWeights(engine, update)
    rng = random.Random(0)

    async def generate(batch: list[tuple[int, ...]], max_tokens: int, seed: int) -> tuple[list[Any], float]:
        began = time.perf_counter()
        out = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(
            max_tokens=max_tokens, temperature=1.0, seed=seed + i))) for i, p in enumerate(batch)))
        return list(out), time.perf_counter() - began

    def trainer_view(samples: list[Any]) -> list[tuple[float, ...]]:
        with engine.weights_lock, engine.lora_fold.unfolded():  # the trainer's model: LoRA beside the base
            return update.trained_logprobs(samples)

    async def logprob_gap(batch: list[tuple[int, ...]], generations: list[Any]) -> dict[str, float]:
        samples = []
        for prompt, generation in zip(batch, generations):
            ids = prompt + generation.completion_ids
            mask = (0,) * len(prompt) + (1,) * len(generation.completion_ids)
            samples.append(Sample(rollout_id="gap", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
                                  behaviour_logprobs_T=(0.0,) * len(prompt) + generation.logprobs,
                                  advantages_T=(0.0,) * len(ids), policy_version_T=(0,) * len(ids)))
        recomputed = await engine.on_worker(lambda: trainer_view(samples))
        return gap([g.logprobs for g in generations], recomputed)

    try:
        await generate(prompts(rng, 2, 16, vocab), 4, 0)  # warm-up: kernels, allocator, the worker thread
        memory.start()
        _, prefill_s = await generate(prompts(rng, args.batch, args.context, vocab), 1, 100)
        batch = prompts(rng, args.batch, args.context, vocab)
        rows_before, decode_s_before = engine.stats.rows_decoded, engine.stats.decode_s
        generations, full_s = await generate(batch, args.new_tokens, 200)
        decoded = engine.stats.rows_decoded - rows_before  # tokens sampled by decode passes (after the prefill's)
        decode_tps = decoded / (engine.stats.decode_s - decode_s_before)
        decode_peak = memory.peak_gb()
        produced = sum(len(g.completion_ids) for g in generations)
        if produced != args.batch * args.new_tokens:
            raise RuntimeError(f"decoded {produced} tokens, expected {args.batch} x {args.new_tokens}: "
                               "a row ended early, so the tokens/s figure would be wrong")
        gap_before = await logprob_gap(batch, generations)

        samples = training_samples(args, vocab)
        for _ in range(args.warmup):
            await weights.apply(samples)
        memory.start()
        steps = [await weights.apply(samples) for _ in range(args.steps)]
        train_peak = memory.peak_gb()
        for metrics in steps:
            if metrics.get("train/skipped"):
                raise RuntimeError(f"a training step was skipped: {metrics}")
        step_s = sum(m["train/step_seconds"] for m in steps)
        tokens = sum(m["train/tokens_real"] for m in steps)

        batch_after = prompts(rng, args.batch, args.context, vocab)
        generations_after, _ = await generate(batch_after, args.new_tokens, 300)
        gap_after = await logprob_gap(batch_after, generations_after)
    finally:
        await engine.close()

    peak, why = peak_flops(device, dtype)
    decode_ctx = args.context + (args.new_tokens - 1) / 2  # attended positions, on average over the decode
    decode_flops = 2 * flops["matmul_params"] + flops["attention"] * decode_ctx
    row_flops = (6 * flops["body"] * args.length + 6 * flops["head"] * args.trained
                 + 3 * flops["attention"] * args.length * (args.length + 1) / 2)
    train_tps = tokens / step_s
    train_flops_per_token = row_flops / args.length
    return {
        "shape": args.child,
        "params": int(flops["params"]),
        "dtype": dtype,
        "build_s": round(build_s, 1),
        "decode": {"batch": args.batch, "context": args.context, "new_tokens": args.new_tokens,
                   "tokens_per_s": round(decode_tps, 1), "prefill_tokens_per_s": round(
                       args.batch * args.context / prefill_s, 1), "seconds": round(full_s, 2),
                   "peak_memory_gb": decode_peak, "flops_per_token": decode_flops,
                   "mfu": round(decode_tps * decode_flops / peak, 4) if peak else None},
        "train": {"rows": args.rows, "length": args.length, "trained": args.trained, "warmup": args.warmup,
                  "steps": args.steps, "tokens_per_s": round(train_tps, 1), "step_s": round(step_s / args.steps, 2),
                  "losses": [m["train/loss"] for m in steps], "grad_norms": [m["train/grad_norm"] for m in steps],
                  "micro_batches": steps[-1]["train/micro_batches"],
                  "gradient_checkpointing": bool(steps[-1]["train/gradient_checkpointing"]),
                  "peak_memory_gb": train_peak, "flops_per_token": train_flops_per_token,
                  "mfu": round(train_tps * train_flops_per_token / peak, 4) if peak else None},
        "mfu_note": why,
        "peak_flops": peak,
        "memory_kind": "torch.cuda.max_memory_allocated" if torch.device(device).type == "cuda" else "peak RSS",
        "logprob_gap": {"before_training": gap_before, "after_training": gap_after},
    }


def trl_record() -> dict[str, Any]:
    if importlib.util.find_spec("trl") is None:
        return {"ran": False, "why": "trl is not importable in this environment"}
    return {"ran": False, "why": "trl is importable, but this bench has no GRPOTrainer side yet; "
                                 "bench/trl_vs_mtrl.py compares the two on CPU (SmolLM2-135M)"}


def device_slug(device: str) -> str:
    info = device_info(device)
    return "cpu" if info["type"] != "cuda" else re.sub(r"[^a-z0-9]+", "-", info["name"].lower()).strip("-")


def child_command(args: argparse.Namespace, shape: str) -> list[str]:
    flags = ["--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads),
             "--learning-rate", str(args.learning_rate), "--micro-batch-tokens", str(args.micro_batch_tokens)]
    for name in DEFAULTS["cpu"]:
        flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return [sys.executable, str(Path(__file__).resolve()), "--child", shape, *flags]


def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    runs: dict[str, Any] = {}
    for shape in args.shapes:
        began = time.perf_counter()
        proc = subprocess.run(child_command(args, shape), capture_output=True, text=True)
        if proc.returncode == 0:
            runs[shape] = json.loads(proc.stdout.strip().splitlines()[-1])
        else:  # out of memory, or a failure: recorded, and the next shape runs
            tail = proc.stderr.strip().splitlines()[-12:]
            oom = any("out of memory" in line.lower() for line in tail)
            runs[shape] = {"shape": shape, "error": "out of memory" if oom else f"exit {proc.returncode}",
                           "stderr_tail": tail}
        runs[shape]["wall_s"] = round(time.perf_counter() - began, 1)
        print(json.dumps(runs[shape]), flush=True)
    load_after = os.getloadavg()
    dtypes = {shape: run.get("dtype", "not run") for shape, run in runs.items()}
    result = {
        "command": "python bench/gpu.py " + " ".join(sys.argv[1:]),
        "model": f"Qwen3 shapes from config, random weights, LoRA r={LORA_RANK} on q/k/v/o/gate/up/down, "
                 "engine and trainer sharing one model (SharedWeights)",
        "runs": runs,
        "trl": trl_record(),
        "machine": machine_info(load_before, load_after, args.threads, dtype=dtypes, device=args.device),
        "load_note": load_note(load_before, load_after, "CPU times are slower than on an idle machine"),
    }
    out = args.out or RESULTS / f"gpu_{device_slug(args.device)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", help=f"comma-separated, of {', '.join(SHAPES)} "
                                         "(default: 0.6b,1.7b,8b on CUDA, tiny,0.6b on CPU)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (engine and torch) on a CPU device")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    for name, value in DEFAULTS["cpu"].items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            help=f"default {DEFAULTS['cuda'][name]} on CUDA, {value} on CPU")
    parser.add_argument("--out", type=Path, help="results file (default bench/results/gpu_<device>.json)")
    parser.add_argument("--child", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    kind = "cuda" if torch.device(args.device).type == "cuda" else "cpu"
    for name, value in DEFAULTS[kind].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    shapes = (args.shapes or ("0.6b,1.7b,8b" if kind == "cuda" else "tiny,0.6b")).split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    if not 0 < args.trained < args.length:
        parser.error(f"--trained must be between 1 and --length - 1, got {args.trained} (length {args.length})")
    if args.new_tokens < 2 or args.steps < 1 or args.warmup < 0:
        parser.error(f"--new-tokens >= 2, --steps >= 1, --warmup >= 0; got {args.new_tokens}, {args.steps}, "
                     f"{args.warmup}")
    args.shapes = shapes
    return args


if __name__ == "__main__":
    parsed = parse()
    if parsed.child:
        print(json.dumps(asyncio.run(measure(parsed))))
    else:
        main(parsed)
