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

``packing_pays(model)`` decides ``cpu_linear: auto``: it times a pass over
the model's largest linear weights (``PROBE_BYTES`` of them: more than the
caches hold, so each is read from memory as in a decode step) both ways at
the engine's decode batch size on this CPU, and packs where oneDNN is at
least ``MIN_GAIN`` faster (it is in fp32 on the AMD EPYC development boxes,
and in bf16 on an AVX512-BF16 Xeon; a CPU where MKL's own kernels are the
fast ones keeps them). One weight timed over and over stays in cache and
made the verdict a coin toss on that Xeon (1.17-1.23x against 1.3x over
the whole model). The engine runs the probe on its worker thread: run
anywhere else, its matmuls start a second OpenMP team, which halved the
speed of every decode step after it (``_worker``'s docstring).
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
PROBE_BYTES = 32 << 20  # how much of the model's weights ``packing_pays`` times: more than a CPU's caches hold


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


def packing_pays(model: Any, rows: int = PACK_ROWS, repeats: int = 3) -> bool:
    """Whether oneDNN with packed weights beats ``F.linear`` by ``MIN_GAIN`` on ``model``'s largest linear
    weights (not the LM head; ``PROBE_BYTES`` of them, or all), each read once per pass as in a decode step,
    at ``rows`` rows, on this CPU (CPU models in a ``packable_dtypes`` dtype; tens of ms). Best of ``repeats``
    passes a side, interleaved. Call it on the thread that will decode (``_worker``'s docstring says why)."""
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype not in packable_dtypes():
        return False
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == weight.dtype]
    if not linears:
        return False
    probes, size = [], 0
    for module in sorted(linears[:-1] or linears, key=lambda m: -m.weight.numel()):
        if size >= PROBE_BYTES:
            break
        probes.append(module.weight.detach())
        size += probes[-1].numel() * probes[-1].element_size()
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in probes}
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in probes]
    plain = dnnl = float("inf")
    with torch.no_grad():
        for round_ in range(repeats + 1):
            plain_s = _timed(lambda: [F.linear(inputs[w.shape[1]], w) for w in probes])
            dnnl_s = _timed(lambda: [torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], p, None, "none", [], "")
                                     for w, p in zip(probes, packed)])
            if round_:  # the first round warms both paths up and is not counted
                plain, dnnl = min(plain, plain_s), min(dnnl, dnnl_s)
    return plain >= MIN_GAIN * dnnl


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


__all__ = ["CPU_LINEARS", "MIN_GAIN", "PACK_ROWS", "PackedLinears", "packable_dtypes", "packing_pays"]
