"""Linear layers through oneDNN with prepacked weights while the engine decodes on CPU (fp32, or bf16 where
the CPU computes bf16 natively).

A decode step multiplies a handful of rows by every weight of the model:
each weight is read once per step, so the step is bound by how fast the
matmul streams weights, not by arithmetic. torch's default fp32 CPU matmul
(MKL) reorders each weight into its own layout at every call, and that copy
is most of a small-batch matmul; oneDNN's ``_linear_pointwise`` reads a
weight reordered once (``_reorder_linear_weight``). Measured on SmolLM2's
weights, cold (each read once, as in a decode step), 2 threads: see
``docs/performance.md``, "Decode at long context".

``PackedLinears`` keeps the reordered copy of each ``nn.Linear`` weight
(one more copy of the model's linear weights) and serves a layer's forward
from it only when no gradient is being recorded and input and weight share
a packable dtype on CPU (``packable_dtypes``: fp32, and bf16 where the CPU
has AVX512-BF16 or AMX); training forwards and everything else go through
``F.linear`` as before. A copy is made again, lazily, whenever its weight changed: the
weight's identity and version counter (bumped by every in-place write:
folding LoRA, an optimizer step, loading an adapter) are checked at every
call, so a stale copy is never used. The outputs equal ``F.linear``'s to
float summation order (~1e-6 relative in fp32; in bf16 identical on the
AVX512-BF16 Xeon measured, where ``F.linear`` runs oneDNN's kernels too).

``packing_pays(model)`` decides ``cpu_linear: auto``: it times one of the
model's MLP weights both ways at the engine's decode batch size on this CPU
and packs where oneDNN is at least ``MIN_GAIN`` faster (it is in fp32 on
the AMD EPYC development boxes, and in bf16 on an AVX512-BF16 Xeon; a CPU
where MKL's own kernels are the fast ones keeps them).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.nn.functional as F

from ...torch_support import cpu_has_native_bf16

CPU_LINEARS = ("auto", "packed", "aten")  # engine option cpu_linear: probe, always pack, never pack
MIN_GAIN = 1.15  # oneDNN must beat F.linear by this much on the probe for "auto" to pack
PACK_ROWS = 16  # the batch-size hint the weights are reordered for (a decode batch's rows)


class PackedLinears:
    """The oneDNN-packed copies of a model's linear weights, used by inference forwards (module docstring)."""

    def __init__(self, model: Any, rows: int = PACK_ROWS) -> None:
        self.rows = rows
        self.dtypes = packable_dtypes()
        self.enabled = True  # False: every forward through F.linear (the copies are kept, still checked on use)
        self.packs = 0  # weights reordered (again: after a change) since the start
        self.layers = 0
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.forward = functools.partial(self._forward, module)  # the instance's own forward
                self.layers += 1

    def _forward(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        weight = module.weight
        if not self.enabled or torch.is_grad_enabled() or x.dtype != weight.dtype or x.dtype not in self.dtypes \
                or x.device.type != "cpu":
            return F.linear(x, weight, module.bias)
        packed = module.__dict__.get("_mtrl_packed")
        key = (id(weight), weight._version)
        if packed is None or packed[0] != key:
            packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.rows))
            module.__dict__["_mtrl_packed"] = packed
            self.packs += 1
        return torch.ops.mkldnn._linear_pointwise(x if x.is_contiguous() else x.contiguous(), packed[1],
                                                  module.bias, "none", [], "")


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN packs on this CPU: fp32, and bf16 where the CPU computes it natively (elsewhere oneDNN
    emulates bf16, slower than what it would replace); none without oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return ()
    return (torch.float32, torch.bfloat16) if cpu_has_native_bf16() else (torch.float32,)


def packing_pays(model: Any, rows: int = PACK_ROWS, repeats: int = 20) -> bool:
    """Whether oneDNN with a packed weight beats ``F.linear`` by ``MIN_GAIN`` on one of ``model``'s largest
    linear weights, at ``rows`` rows, on this CPU (CPU models in a ``packable_dtypes`` dtype; a few ms)."""
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype not in packable_dtypes():
        return False
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == weight.dtype]
    if not linears:
        return False
    probe = max(linears[:-1] or linears, key=lambda m: m.weight.numel()).weight.detach()  # not the LM head
    x = torch.randn(rows, probe.shape[1], dtype=probe.dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(probe, rows)
    with torch.no_grad():
        plain = _best(lambda: F.linear(x, probe), repeats)
        dnnl = _best(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), repeats)
    return plain >= MIN_GAIN * dnnl


def _best(fn: Any, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


__all__ = ["CPU_LINEARS", "MIN_GAIN", "PACK_ROWS", "PackedLinears", "packable_dtypes", "packing_pays"]
