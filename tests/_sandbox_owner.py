"""A run that owns sandboxes and is killed (tests/test_sandboxes.py): it prints their folders, then waits.

    python tests/_sandbox_owner.py KIND ROOT MARKER

Opens two sandboxes of KIND under ROOT, starts a long ``sleep`` carrying
MARKER in each (one through ``start``, one as a running command), writes a
file in each workspace, prints one JSON line (the folders, the reaper's pid)
and sleeps until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings

from mtrl_runtime.sandboxes import Sandboxes


async def main(kind: str, root: str, marker: str) -> None:
    warnings.simplefilter("ignore")
    provider = Sandboxes({"kind": kind, "root": root})
    boxes = [await provider.open(f"owner-{i}") for i in range(2)]
    for box in boxes:
        await box.write_file("work.txt", "in progress\n")
    await boxes[0].start(["sh", "-c", f"sleep 300 # {marker}"])
    running = asyncio.ensure_future(boxes[1].run(["sh", "-c", f"sleep 301 # {marker}"], timeout_s=600))
    await asyncio.sleep(0.5)
    print(json.dumps({"folders": [str(b.dirs.path) for b in boxes], "reaper": provider._reaper.pid}), flush=True)
    await running


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
