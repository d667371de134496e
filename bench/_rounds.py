"""Protocols measured side by side on a shared machine: interleaved rounds, rotated order, paired ratios.

On this shared 2-core box the share of a core the server gets drifts within
seconds: chat completions measured twice back to back in one server gave a
p50 of 14.7 then 26.6 ms at 32 clients (its CPU per call 0.50 then 0.56 ms).
At 32 clients the server is CPU-bound, so its latency is 32 calls' CPU
divided by that share, and one run per protocol compares the drift rather
than the protocols. So each protocol runs in ``rounds`` short runs; every
round runs each protocol once, the order rotated by one place a round, so
each protocol is measured in every position equally often. Figures are
pooled over the rounds (p50/p95 of all latencies, total CPU over total calls),
and each round's ratio to the baseline of the same round (paired) is kept, so
the spread of single-run ratios shows beside the pooled one.

    runs = await interleaved(run_one, ["chat", "converse"], rounds=5)
    pooled(runs["converse"]); paired(runs["converse"], runs["chat"], "p50_ms")
"""

from __future__ import annotations

import statistics
from typing import Any, Awaitable, Callable, Sequence

from endpoint_overhead import pct

Run = dict[str, Any]  # one run: "latencies" (s), "cpu_s" (the server's), "wall_s", "errors"


def rotated(names: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """``(round, name)`` in the order to run them: every round each name once, the order rotated by one place a
    round (with two names, swapped every round), so each is measured in every position equally often."""
    if rounds < 1:
        raise ValueError(f"rounds: must be >= 1, got {rounds}")
    names = list(names)
    return [(i, name) for i in range(rounds) for name in names[i % len(names):] + names[:i % len(names)]]


async def interleaved(run_one: Callable[[str], Awaitable[Run]], names: list[str], rounds: int) -> dict[str, list[Run]]:
    """``rounds`` rounds of one run of each name, the order rotated every round; the runs by name, in round order."""
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for _, name in rotated(names, rounds):
        runs[name].append(await run_one(name))
    return runs


def figures(run: Run) -> dict[str, float]:
    """One run's p50 and server CPU per call, in ms."""
    return {"p50_ms": pct(run["latencies"], 0.5) * 1e3, "server_cpu_ms_per_call": run["cpu_s"] / len(run["latencies"]) * 1e3}


def pooled(runs: list[Run]) -> dict[str, float]:
    """All rounds of one protocol together: latency percentiles of every call, total CPU and wall over all calls."""
    latencies = [x for r in runs for x in r["latencies"]]
    calls = len(latencies)
    return {
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p95_ms": pct(latencies, 0.95) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "server_cpu_ms_per_call": sum(r["cpu_s"] for r in runs) / calls * 1e3,
        "calls_per_s": calls / sum(r["wall_s"] for r in runs),
        "calls": calls,
        "errors": sum(r["errors"] for r in runs),
    }


def paired(runs: list[Run], base: list[Run], key: str) -> dict[str, Any]:
    """Round by round, ``key`` of ``runs`` over ``key`` of ``base`` (same round): median, min, max and each."""
    ratios = [figures(a)[key] / figures(b)[key] for a, b in zip(runs, base, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "rounds": ratios}


__all__ = ["Run", "figures", "interleaved", "paired", "pooled"]


def report_row(clients: str, name: str, r: dict[str, Any], name_width: int) -> str:
    """One printed row of a side-by-side report: a baseline's figures (ratios 1.00), or a protocol's with its
    ratios to the baseline and the per-round paired medians [ranges] of p50 and CPU."""
    ratio = {key: f"{r[key]:>7.2f}" if key in r else f"{'1.00':>7}" for key in ("p50_ratio", "p95_ratio", "cpu_ratio")}
    line = (f"{clients:>8} {name:>{name_width}} {r['p50_ms']:>8.3f}ms {ratio['p50_ratio']} {r['p95_ms']:>8.3f}ms "
            f"{ratio['p95_ratio']} {r['server_cpu_ms_per_call']:>14.3f}ms {ratio['cpu_ratio']} {r['errors']:>7}")
    if "paired_p50_ratio" in r:
        pp, pc = r["paired_p50_ratio"], r["paired_cpu_ratio"]
        line += (f"   {pp['median']:.2f} [{pp['min']:.2f}..{pp['max']:.2f}], "
                 f"{pc['median']:.2f} [{pc['min']:.2f}..{pc['max']:.2f}]")
    return line
