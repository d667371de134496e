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

``packing_plan(model)`` decides ``cpu_linear: auto``, per weight shape
(q and o projections share one, k and v another, ...): it times a pass
over each shape's weights (up to ``PROBE_BYTES`` of them) both ways on
this CPU, at one row and at a decode batch's ``PROBE_ROWS``. A shape is
packed where oneDNN is at least ``MIN_GAIN`` faster at ``PROBE_ROWS``, from
one row where it is as fast there too, else from ``CROSSOVER_ROWS``: fewer
rows go through ``F.linear``. The kernels' merits differ by shape and row
count. Measured on SmolLM2's weights, cold, 2 threads, on an AVX512-BF16
Xeon (``bench/cpu_linear_plan.py``): in bf16 oneDNN is 1.17-1.53x faster for
every shape; in fp32 it is 2.66x faster for the LM head (49,152 x 576) at 8
rows but 0.67-1.28x for the layers' weights, and at one row MKL's
matrix-vector product reads an fp32 weight at the memory's speed where
oneDNN takes 1.15-2.2x as long. A whole-model verdict either lost the LM
head's gain or slowed the k and v projections and lone rows. (On the AMD
EPYC development boxes packing the whole fp32 model was 1.69x faster; how
that splits by shape there is not measured.)

A decode step reads each weight from memory, not from a cache, unless the
model fits in the CPU's last-level cache. The probe's weights would stay in
that cache between its rounds (that Xeon's VM reports 260 MiB of it), where
the kernels run alike, and made the verdict a coin toss there; so when the
model's linear weights exceed that cache, each round starts cold: a buffer
twice the cache's size is read first (``_Eviction``), and within a round
each weight (and each packed copy) is read once. The engine runs the probe
on its worker thread: run anywhere else, its matmuls start a second OpenMP
team, which halved the speed of every decode step after it (``_worker``'s
docstring).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ...torch_support import cpu_has_native_bf16

CPU_LINEARS = ("auto", "packed", "aten")  # engine option cpu_linear: probe, always pack, never pack
MIN_GAIN = 1.15  # oneDNN must beat F.linear by this much at PROBE_ROWS for "auto" to pack
PACK_ROWS = 16  # the batch-size hint the weights are reordered for (a decode batch's rows)
PROBE_ROWS = 8  # the decode batch the probe times: a group of 8 rollouts decoding together
CROSSOVER_ROWS = 4  # the fewest rows served packed where a single row is faster through F.linear
Shape = tuple[int, int]  # a linear weight's (out_features, in_features)
PROBE_BYTES = 32 << 20  # how much of each weight shape ``packing_plan`` times (at least one weight)
CACHE_BYTES_UNKNOWN = 64 << 20  # the last-level cache assumed where the system does not say
_COPY = "_mtrl_packed"  # where a served linear keeps (its weight's identity and version, the packed copy)


class PackedLinears:
    """The oneDNN-packed copies of a model's linear weights, used by inference forwards (module docstring).

    ``plan`` maps a weight shape to the fewest rows its forwards run packed
    from (``packing_plan``); linears of other shapes keep ``F.linear``.
    None: every linear, from one row."""

    def __init__(self, model: Any, rows: int = PACK_ROWS, plan: Mapping[Shape, int] | None = None) -> None:
        self.rows = rows
        self.plan = dict(plan) if plan is not None else None
        self.dtypes = packable_dtypes()
        self.enabled = True  # False: every forward through F.linear (the copies are kept, still checked on use)
        self.packs = 0  # weights reordered (again: after a change) since the start
        self._served: list[torch.nn.Linear] = []
        for module in model.modules():
            if type(module) is not torch.nn.Linear:
                continue
            min_rows = 1 if self.plan is None else self.plan.get(tuple(module.weight.shape))
            if min_rows is not None:
                module.forward = functools.partial(self._forward, module, min_rows)  # the instance's own forward
                self._served.append(module)

    @property
    def layers(self) -> int:
        """How many linears this serves."""
        return len(self._served)

    def release(self) -> None:
        """Give every served linear its class's forward back and drop its packed copy."""
        for module in self._served:
            module.__dict__.pop("forward", None)
            module.__dict__.pop(_COPY, None)
        self._served = []

    def _forward(self, module: torch.nn.Linear, min_rows: int, x: torch.Tensor) -> torch.Tensor:
        weight = module.weight
        if not self.enabled or torch.is_grad_enabled() or x.dtype != weight.dtype or x.dtype not in self.dtypes \
                or x.device.type != "cpu" or x.numel() < min_rows * x.shape[-1]:
            return F.linear(x, weight, module.bias)
        packed = module.__dict__.get(_COPY)
        key = (id(weight), weight._version)
        if packed is None or packed[0] != key:
            packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.rows))
            module.__dict__[_COPY] = packed
            self.packs += 1
        return torch.ops.mkldnn._linear_pointwise(x if x.is_contiguous() else x.contiguous(), packed[1],
                                                  module.bias, "none", [], "")


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN packs on this CPU: fp32, and bf16 where the CPU computes it natively (elsewhere oneDNN
    emulates bf16, slower than what it would replace); none without oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return ()
    return (torch.float32, torch.bfloat16) if cpu_has_native_bf16() else (torch.float32,)


def packing_plan(model: Any, repeats: int = 3) -> dict[Shape, int]:
    """Per linear weight shape of ``model``, the fewest rows from which its inference forwards should run
    packed on this CPU (``choose`` over ``probe_times``); shapes where packing does not pay are left out, and
    a model on another device or in a dtype oneDNN does not pack here gets no plan. Call it on the thread that
    will decode (``_worker``'s docstring says why)."""
    return plan_from(probe_times(model, repeats))


def plan_from(times: Mapping[tuple[Shape, int], tuple[float, float]]) -> dict[Shape, int]:
    """The plan ``choose`` makes from ``probe_times``' seconds: the shapes worth packing, and from how many rows."""
    plan = {}
    for shape in dict.fromkeys(shape for shape, _ in times):
        min_rows = choose(*times[shape, 1], *times[shape, PROBE_ROWS])
        if min_rows is not None:
            plan[shape] = min_rows
    return plan


def probe_times(model: Any, repeats: int = 3) -> dict[tuple[Shape, int], tuple[float, float]]:
    """Seconds of ``F.linear`` and of oneDNN with packed weights per (weight shape, rows), at one row and at
    ``PROBE_ROWS``, on ``model``'s linears (none where oneDNN does not pack its dtype on this CPU). Each
    shape's weights (``PROBE_BYTES`` of them, or one) are read once a round, every round cold when the model
    outgrows the last-level cache (module docstring); best of ``repeats`` rounds, after one that warms up
    (under a second with SmolLM2 at 2 threads)."""
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype not in packable_dtypes():
        return {}
    weights: dict[Shape, list[torch.Tensor]] = {}
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == weight.dtype:
            weights.setdefault(tuple(module.weight.shape), []).append(module.weight.detach())
    total = sum(w.numel() * w.element_size() for group in weights.values() for w in group)
    cache = last_level_cache_bytes()
    eviction = _Eviction(cache) if total > cache else None
    probes = {shape: _up_to(group, PROBE_BYTES) for shape, group in weights.items()}
    packed = {shape: [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in group]
              for shape, group in probes.items()}
    best: dict[tuple[Shape, int], tuple[float, float]] = {}
    with torch.no_grad():
        for rows in (1, PROBE_ROWS):
            inputs = {shape: torch.randn(rows, shape[1], dtype=weight.dtype) for shape in probes}
            for round_ in range(repeats + 1):
                if eviction is not None:
                    eviction()
                for shape, group in probes.items():
                    x = inputs[shape]
                    plain_s = _timed(lambda: [F.linear(x, w) for w in group])
                    dnnl_s = _timed(lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                             for p in packed[shape]])
                    if round_:  # the first round warms both paths up and is not counted
                        plain, dnnl = best.get((shape, rows), (plain_s, dnnl_s))
                        best[shape, rows] = (min(plain, plain_s), min(dnnl, dnnl_s))
    return best


def choose(plain_one: float, dnnl_one: float, plain_many: float, dnnl_many: float) -> int | None:
    """From the seconds of ``F.linear`` and of oneDNN at one row and at ``PROBE_ROWS``: None (keep
    ``F.linear``) unless oneDNN is ``MIN_GAIN`` faster at ``PROBE_ROWS``; then 1 where it is at least as fast
    at one row, else ``CROSSOVER_ROWS``."""
    if plain_many < MIN_GAIN * dnnl_many:
        return None
    return 1 if plain_one >= dnnl_one else CROSSOVER_ROWS


def _up_to(group: list[torch.Tensor], limit: int) -> list[torch.Tensor]:
    """The first weights of ``group`` up to ``limit`` bytes (at least one)."""
    chosen, size = [], 0
    for w in group:
        if chosen and size >= limit:
            break
        chosen.append(w)
        size += w.numel() * w.element_size()
    return chosen


def last_level_cache_bytes() -> int:
    """The size of the largest CPU cache the system reports (Linux sysfs), or ``CACHE_BYTES_UNKNOWN``."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        size = cache_size_bytes(entry.read_text())
        if size is not None:
            sizes.append(size)
    return max(sizes, default=CACHE_BYTES_UNKNOWN)


def cache_size_bytes(text: str) -> int | None:
    """A sysfs cache size ("48K", "266240K", "32M") in bytes; None for anything else."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    return int(digits) * scale if digits.isdigit() else None


class _Eviction:
    """Reading a buffer twice the last-level cache's size pushes the weights a probe timed out of it."""

    def __init__(self, cache_bytes: int) -> None:
        self.buffer = torch.ones(2 * cache_bytes // 4, dtype=torch.float32)  # written, so its pages are real

    def __call__(self) -> None:
        self.buffer.sum()


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


__all__ = ["CPU_LINEARS", "CROSSOVER_ROWS", "MIN_GAIN", "PACK_ROWS", "PROBE_ROWS", "PackedLinears", "Shape",
           "cache_size_bytes", "choose", "last_level_cache_bytes", "packable_dtypes", "packing_plan", "plan_from",
           "probe_times"]
