"""What every benchmark records about the machine it ran on: cores, engine threads, load, precision.

``machine_info(..., dtype=...)`` is the ``machine`` block of a results file.
``dtype`` is what the bench really ran (read it from the model with
``model_dtype``, never from a flag it was asked for): one name, or a mapping
of side or model -> name when sides differ. The block also says whether this
CPU computes bf16 natively (``cpu_native_bf16``), because a bf16 figure from a
CPU without AVX512-BF16/AMX measures an emulation. ``device="cuda"`` adds
the GPU's name, memory, compute capability and CUDA version
(``device_info``).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def model_dtype(model: Any) -> str:
    """The dtype of ``model``'s first parameter as fp32 / bf16 / fp16 (what its matmuls run in)."""
    dtype = str(next(model.parameters()).dtype)
    return DTYPE_NAMES.get(dtype, dtype)


def cpu_bf16() -> dict[str, Any]:
    """This CPU's bf16 capability: the probe the engines use, and the flags behind it."""
    import torch

    from mtrl_runtime.torch_support import cpu_has_native_bf16

    flags = {name: bool(getattr(torch.cpu, probe, lambda: False)())
             for name, probe in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx", "_is_amx_tile_supported"))}
    return {"cpu_native_bf16": cpu_has_native_bf16(), **flags}


def device_info(device: str) -> dict[str, Any]:
    """The device a bench ran on: ``{"type": "cpu"}``, or a CUDA device's name, memory, capability, CUDA version."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return {"type": dev.type}
    props = torch.cuda.get_device_properties(dev)
    return {
        "type": "cuda",
        "name": props.name,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "count": torch.cuda.device_count(),
        "torch_cuda": torch.version.cuda,
    }


def machine_info(
    load_before: tuple[float, ...], load_after: tuple[float, ...], threads: int, *, dtype: str | Mapping[str, str],
    device: str = "cpu",
) -> dict[str, Any]:
    """The ``machine`` block of a results file (``threads``: the engine's CPU threads; ``dtype``: see above;
    ``device``: where the model ran, ``device_info``)."""
    import torch

    if not dtype or (not isinstance(dtype, str) and not all(isinstance(v, str) and v for v in dtype.values())):
        raise ValueError(f"dtype: name the dtype the bench ran (model_dtype(model)), got {dtype!r}")
    return {
        "cpus": os.cpu_count(),
        "engine_threads": threads,
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        **cpu_bf16(),
        "dtype": dtype if isinstance(dtype, str) else dict(dtype),
        "device": device_info(device),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


def save_results(path: Path, results: dict[str, Any]) -> dict[str, Any]:
    """Write a bench's results as indented JSON at ``path`` (its folder made); returns them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def load_note(load_before: tuple[float, ...], load_after: tuple[float, ...], busy_means: str) -> str:
    """Say whether other processes competed for the cores (load average above the CPU count)."""
    busy = max(load_before[0], load_after[0]) > (os.cpu_count() or 1)
    return f"machine busy with other processes (load average above the CPU count); {busy_means}" if busy \
        else "machine mostly idle"


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's answer."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # no /proc/cpuinfo (not Linux): the platform's own name below is the answer, nothing is lost
        pass
    return platform.processor() or platform.machine()
