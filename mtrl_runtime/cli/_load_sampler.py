"""How busy the machine was while a command ran: the load sampled through the run, not read once at its end.

The load average at a run's end describes the last minutes only: a demo that
shared the machine for most of its 45 minutes and finished alone was called
quiet. ``LoadSampler`` reads the 1-minute load average every ``interval_s``
seconds on a background thread for as long as the run lasts, and, where
``/proc/stat`` exists (Linux), the CPU time the whole machine spent against the
CPU time this process (and the children it waited for) spent: the rest is what
other processes took, the direct measure of sharing. ``LoadSummary`` holds the
figures; ``load_verdict`` decides from them, with no clock and no I/O.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SHARED_CPU_SHARE = 0.15  # other processes used at least this share of all cores' time: the run was shared


@dataclass(frozen=True)
class LoadSummary:
    """The 1-minute load averages sampled through a run, and the CPU share other processes took (None: unknown)."""

    loads: tuple[float, ...]  # os.getloadavg()[0] at the start, every interval_s, and at the end
    interval_s: float
    wall_s: float
    cpus: int
    others_cpu_share: float | None  # (machine busy CPU - this process's CPU) / (wall x cpus), 0..1

    @property
    def median(self) -> float:
        return statistics.median(self.loads)

    @property
    def peak(self) -> float:
        return max(self.loads)

    def share_above(self, level: float) -> float:
        """The share of the samples whose load was above ``level``."""
        return sum(load > level for load in self.loads) / len(self.loads)


def load_verdict(summary: LoadSummary, own_threads: int) -> tuple[bool, str]:
    """``(shared, why)``: whether other work took CPU time from the run, in words.

    Other processes' CPU share decides where it is known; otherwise the median
    sampled load against what the run adds by itself (``own_threads``, at most
    the cores) plus one.
    """
    own = min(own_threads, summary.cpus)
    if summary.others_cpu_share is not None:
        share = summary.others_cpu_share
        shared = share >= SHARED_CPU_SHARE
        return shared, f"other processes used {share:.0%} of the {summary.cpus} cores' time while it ran"
    shared = summary.median > own + 1
    return shared, f"the median load while it ran was {summary.median:.2f}, against the ~{own} it adds by itself"


def load_line(summary: LoadSummary, own_threads: int) -> str:
    """The load through the run, in one line: median, peak, and the share of the run above what the run adds."""
    own = min(own_threads, summary.cpus)
    others = ("" if summary.others_cpu_share is None
              else f"; other processes' CPU {summary.others_cpu_share:.0%} of the cores' time")
    return (f"load while it ran (1-min average, {len(summary.loads)} samples every {summary.interval_s:.0f} s): "
            f"median {summary.median:.2f}, peak {summary.peak:.2f}, above {own + 1} in "
            f"{summary.share_above(own + 1):.0%} of the samples{others}")


def _machine_cpu_s() -> tuple[float, float] | None:
    """``(busy, total)`` CPU seconds of all cores since boot from ``/proc/stat``; None where it does not exist."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq + steal
    return busy / tick, (busy + idle + iowait) / tick


def _own_cpu_s() -> float:
    """CPU seconds of this process (every thread) and of the children it waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class LoadSampler:
    """Samples the load on a daemon thread between ``start()`` and ``stop()`` (or as a context manager).

    The readers are parameters so that a test can drive it; the defaults read
    the real machine.
    """

    def __init__(
        self,
        interval_s: float = 15.0,
        *,
        read_load: Callable[[], float] = lambda: os.getloadavg()[0],
        read_machine_cpu: Callable[[], tuple[float, float] | None] = _machine_cpu_s,
        read_own_cpu: Callable[[], float] = _own_cpu_s,
        clock: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s: expected seconds > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self._read_load, self._read_machine_cpu, self._read_own_cpu, self._clock = (
            read_load, read_machine_cpu, read_own_cpu, clock)
        self.cpus = cpus or os.cpu_count() or 1
        self._loads: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start: tuple[float, tuple[float, float] | None, float] | None = None
        self._summary: LoadSummary | None = None

    def start(self) -> "LoadSampler":
        if self._thread is not None:
            raise RuntimeError("LoadSampler.start(): already started; a sampler covers one run")
        self._start = (self._clock(), self._read_machine_cpu(), self._read_own_cpu())
        self._loads.append(self._read_load())
        self._thread = threading.Thread(target=self._sample, name="mtrl-load-sampler", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._loads.append(self._read_load())

    def stop(self) -> LoadSummary:
        """Stop sampling (once) and return the run's summary."""
        if self._summary is not None:
            return self._summary
        if self._thread is None or self._start is None:
            raise RuntimeError("LoadSampler.stop(): never started")
        self._stop.set()
        self._thread.join()
        self._loads.append(self._read_load())
        started, machine_before, own_before = self._start
        wall = self._clock() - started
        machine_after, own = self._read_machine_cpu(), self._read_own_cpu() - own_before
        share = None
        if machine_before is not None and machine_after is not None:
            busy, total = (after - before for after, before in zip(machine_after, machine_before))
            if total > 0:
                share = min(1.0, max(0.0, (busy - own) / total))
        self._summary = LoadSummary(tuple(self._loads), self.interval_s, wall, self.cpus, share)
        return self._summary

    def __enter__(self) -> "LoadSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LoadSampler", "LoadSummary", "load_line", "load_verdict"]
