"""What every benchmark records about the machine it ran on: cores, engine threads, load before and after."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine_info(load_before: tuple[float, ...], load_after: tuple[float, ...], threads: int) -> dict[str, Any]:
    """The ``machine`` block of a results file (``threads``: the engine's CPU threads)."""
    import torch

    return {
        "cpus": os.cpu_count(),
        "engine_threads": threads,
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


def load_note(load_before: tuple[float, ...], load_after: tuple[float, ...], busy_means: str) -> str:
    """Say whether other processes competed for the cores (load average above the CPU count)."""
    busy = max(load_before[0], load_after[0]) > (os.cpu_count() or 1)
    return f"machine busy with other processes (load average above the CPU count); {busy_means}" if busy \
        else "machine mostly idle"
