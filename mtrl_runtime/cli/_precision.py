"""The precision a CPU run uses, chosen from what this CPU computes natively, recorded and said out loud.

A recipe says ``engine_options.dtype: auto`` (and leaves ``advanced.precision``
at ``auto``); ``resolve_precision`` turns both into the dtype the probe
picks (``torch_support.cpu_has_native_bf16``: bf16 where the CPU has
AVX512-BF16 or AMX, fp32 elsewhere, where bf16 is emulated and several times
slower) before the run starts, so the run's params hold what it really ran
and the user is told why. A dtype the recipe names is kept as it is.
"""

from __future__ import annotations

from ..config import MtrlConfig


def resolve_precision(config: MtrlConfig) -> tuple[MtrlConfig, str]:
    """``config`` with the hf engine's ``auto`` dtype and ``advanced.precision`` resolved, and a line saying so.

    Other engines keep their options (vLLM picks its own dtype).
    """
    from ..engines.hf import auto_dtype
    from ..torch_support import cpu_has_native_bf16

    if config.core.engine != "hf":
        return config, f"precision: as the {config.core.engine} engine chooses"
    options = config.advanced.engine_options
    device = str(options.get("device", "cpu"))
    overrides: dict[str, str] = {}
    if options.get("dtype", "auto") == "auto":
        overrides["advanced.engine_options.dtype"] = auto_dtype(device)
    if config.advanced.precision == "auto" and device.startswith("cpu"):
        overrides["advanced.precision"] = auto_dtype(device)
    resolved = config.with_overrides(overrides) if overrides else config
    dtype = resolved.advanced.engine_options.get("dtype", "auto")
    if not device.startswith("cpu"):
        return resolved, f"precision: weights {dtype} on {device}, update {resolved.advanced.precision}"
    native = cpu_has_native_bf16()
    why = ("this CPU computes bf16 natively (AVX512-BF16/AMX)" if native
           else "this CPU has no native bf16 (AVX512-BF16/AMX): bf16 would be emulated and slower")
    chosen = "chosen" if overrides else "as configured"
    return resolved, f"precision: weights {dtype}, update {resolved.advanced.precision} ({chosen}; {why})"


__all__ = ["resolve_precision"]
