"""bench/gpu.py (issue 22 item 6) on its smallest shape on CPU, so the GPU check does not rot between GPU runs.

The real script runs as a user runs it (a child process per shape): the hf
engine decodes, the LoRA policy sharing its model takes a step, and the
results file holds tokens/s, peak memory, the logprob gap and, on a CPU, no
MFU with the reason. The FLOP counts and the GPU peak table are checked
against counts made here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_bench():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu

        yield gpu
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_the_smallest_shape_runs_on_cpu_and_reports_every_figure(tmp_path):
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--shapes", "tiny", "--out", str(out),
           "--batch", "3", "--context", "48", "--new-tokens", "8", "--rows", "2", "--length", "64", "--trained", "40",
           "--warmup", "1", "--steps", "2", "--threads", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    run = result["runs"]["tiny"]
    assert "error" not in run, run
    assert run["decode"]["tokens_per_s"] > 0 and run["decode"]["prefill_tokens_per_s"] > 0
    assert run["train"]["tokens_per_s"] > 0 and run["train"]["steps"] == 2
    assert all(math.isfinite(x) for x in run["train"]["losses"] + run["train"]["grad_norms"])
    assert run["decode"]["peak_memory_gb"] > 0 and run["train"]["peak_memory_gb"] >= run["decode"]["peak_memory_gb"]
    assert run["memory_kind"] == "peak RSS"
    assert run["decode"]["mfu"] is None and run["train"]["mfu"] is None and "cpu" in run["mfu_note"]
    before, after = run["logprob_gap"]["before_training"], run["logprob_gap"]["after_training"]
    assert before["tokens"] == after["tokens"] == 3 * 8  # every sampled token compared
    # the engine's logprobs are what the trainer recomputes (same weights, LoRA B = 0 before any step)
    assert before["approx_kl"] < 1e-3 and before["max_abs"] < 0.05
    assert math.isfinite(after["approx_kl"]) and after["approx_kl"] < 1e-2
    assert result["machine"]["device"] == {"type": "cpu"} and result["machine"]["dtype"] == {"tiny": run["dtype"]}
    assert result["trl"]["ran"] is False and result["trl"]["why"]


def test_flops_count_the_matmul_weights_and_attention(gpu_bench):
    import torch

    from mtrl_runtime.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = gpu_bench.build_model("tiny", tokenizer, "cpu", "fp32")
    flops = gpu_bench.model_flops(model)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # the tied head too
    assert flops["matmul_params"] == pytest.approx(linear, rel=0.01)  # norms are the rest
    assert flops["head"] == len(tokenizer) * 64
    assert flops["attention"] == 4 * 2 * 4 * 16  # 4 x layers x heads x head_dim


def test_the_gpu_peak_table_names_its_gaps(gpu_bench):
    assert gpu_bench.gpu_peak("NVIDIA H100 80GB HBM3", "bf16") == (989e12, None)
    assert gpu_bench.gpu_peak("NVIDIA H100 PCIe", "bf16") == (756e12, None)
    assert gpu_bench.gpu_peak("NVIDIA H200", "bf16") == (989e12, None)
    assert gpu_bench.gpu_peak("NVIDIA A100-SXM4-80GB", "bf16") == (312e12, None)
    peak, why = gpu_bench.gpu_peak("Tesla T4", "bf16")
    assert peak is None and "'Tesla T4' is not in PEAK_BF16" in why
    assert gpu_bench.gpu_peak("NVIDIA H100 80GB HBM3", "fp32")[0] is None
    assert gpu_bench.peak_flops("cpu", "bf16")[0] is None
