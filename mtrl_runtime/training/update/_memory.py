"""Free memory: how much a step may use, and giving freed heap memory back after an update step.

``available_bytes`` is what a new allocation can get now: on CUDA the
device's free memory plus what torch's allocator holds unused; on CPU the
kernel's MemAvailable (Linux), else the physical memory.

glibc keeps one malloc arena per thread that allocates, and keeps what a
step frees inside it. The trainer runs its steps on whichever worker thread
is free, so each step's peak (several GB of activations and logits for a
demo step) can settle in another arena: measured with SmolLM2-135M, the
resident size grew by ~6 GB per step run on a new thread until the kernel
killed the process, and stayed at 0.94 GB with ``malloc_trim`` after each
step. Elsewhere (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path
from typing import Any

import torch


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None else None
    except (OSError, AttributeError):  # no libc by that name, or not glibc
        return None


def release_free_memory() -> bool:
    """Return the heap's free memory to the OS (glibc ``malloc_trim``); whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def available_bytes(device: torch.device) -> int:
    """Bytes a step on ``device`` can allocate now (see the module docstring)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


__all__ = ["available_bytes", "release_free_memory"]
