"""Where the test suite's time goes: each test's wall time against the CPU its worker and children spent.

A pytest plugin and its report in one file, for whoever keeps the suite
fast. Run the suite as CI runs it, with the plugin loaded (``PYTHONPATH``
names ``scripts/`` so that every pytest-xdist worker finds it), then
summarize::

    PYTHONPATH=scripts .venv/bin/python -m pytest -q -n 3 -p suite_profile
    .venv/bin/python scripts/suite_profile.py

Each worker appends one JSON line per test to
``$SUITE_PROFILE_DIR/<worker>.jsonl`` (default ``runs/suite_profile``;
empty it before a new run): its start, wall seconds, the worker's own
CPU seconds (every thread) and its children's (the subprocesses it waited
for: an ``mtrl`` command of a docs block, a ``torchrun`` job). Wall time
that neither accounts for is "unaccounted": a sleep, a wait on a socket,
or a process the test did not wait for (a Ray node, a server a docs page
started in the background, whose CPU lands on the test that reaps it).
The report sums the three per file, lists the tests with the most
unaccounted time, and gives each worker's busy span, so that a tail left
by the scheduler shows.

``--durations-out tests/data/suite_durations.json`` also writes each test's
wall seconds (those of a second or more) for the suite's scheduler, which
starts the longest work first (tests/_xdist_groups.py)::

    .venv/bin/python scripts/suite_profile.py --durations-out tests/data/suite_durations.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "runs" / "suite_profile"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    started, own, children = time.time(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    # the xdist worker's id from its config, not $PYTEST_XDIST_WORKER: a pytest that a test starts inherits that
    worker = getattr(item.config, "workerinput", {}).get("workerid", "main")
    record = {"id": item.nodeid, "worker": worker, "start": started, "wall": time.time() - started,
              "self": _cpu(resource.RUSAGE_SELF) - own, "children": _cpu(resource.RUSAGE_CHILDREN) - children}
    folder = Path(os.environ.get("SUITE_PROFILE_DIR") or DEFAULT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def report(folder: Path, top: int = 20) -> str:
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if not rows:
        raise SystemExit(f"suite_profile: no records under {folder}; run the suite with -p suite_profile first "
                         "(PYTHONPATH=scripts)")
    for row in rows:
        row["unaccounted"] = max(0.0, row["wall"] - row["self"] - row["children"])
    t0 = min(r["start"] for r in rows)
    lines = [f"{len(rows)} tests: wall {sum(r['wall'] for r in rows):.0f} s, worker CPU "
             f"{sum(r['self'] for r in rows):.0f} s, children's CPU {sum(r['children'] for r in rows):.0f} s, "
             f"unaccounted {sum(r['unaccounted'] for r in rows):.0f} s"]
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        end = max(r["start"] + r["wall"] for r in mine) - t0
        lines.append(f"worker {worker}: {len(mine)} tests, first at {min(r['start'] for r in mine) - t0:.0f} s, "
                     f"last ends at {end:.0f} s")
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for row in rows:
        sums = by_file[row["id"].split("::")[0]]
        for i, key in enumerate(("wall", "self", "children", "unaccounted")):
            sums[i] += row[key]
    lines += ["", "| file | wall s | worker CPU s | children's CPU s | unaccounted s |", "| --- | --- | --- | --- | --- |"]
    for name, (wall, own, kids, rest) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name} | {wall:.1f} | {own:.1f} | {kids:.1f} | {rest:.1f} |")
    lines += ["", "| test | wall s | unaccounted s |", "| --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: -r["unaccounted"])[:top]:
        lines.append(f"| {row['id']} | {row['wall']:.1f} | {row['unaccounted']:.1f} |")
    return "\n".join(lines)


def durations(folder: Path, min_s: float = 1.0) -> dict[str, float]:
    """``{node id: wall seconds}`` of the tests that took ``min_s`` or more (the longest run where one ran twice)."""
    found: dict[str, float] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found[row["id"]] = max(found.get(row["id"], 0.0), row["wall"])
    if not found:
        raise SystemExit(f"suite_profile: no records under {folder}; run the suite with -p suite_profile first "
                         "(PYTHONPATH=scripts)")
    return {nodeid: round(wall, 1) for nodeid, wall in sorted(found.items()) if wall >= min_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--durations-out", type=Path, help="also write {node id: wall s} of the tests of 1 s or more")
    args = parser.parse_args()
    print(report(args.folder, args.top))
    if args.durations_out:
        args.durations_out.write_text(json.dumps(durations(args.folder), indent=0) + "\n")


if __name__ == "__main__":
    main()
