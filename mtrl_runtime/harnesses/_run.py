"""One harness CLI run as one rollout's agent, inside that rollout's sandbox (``run_harness``)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtrl_adapters import current_rollout
from mtrl_adapters.wire import rollout_base_urls

from ..types import CommandResult
from ._builtin import HARNESSES
from ._install import install_harness
from ._spec import HarnessCall

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HarnessFailed(RuntimeError):
    """The harness exited non-zero, or ran past its time: the rollout fails with this text."""


@dataclass(frozen=True)
class HarnessResult:
    """What the harness did: its command's result, and the harness's name."""

    harness: str
    command: CommandResult

    @property
    def ok(self) -> bool:
        return self.command.ok

    @property
    def output(self) -> str:
        return self.command.stdout

    def check(self) -> "HarnessResult":
        """This result when the harness ended well, else ``HarnessFailed`` saying how it ended and its last words."""
        if not self.ok:
            tail = (self.command.stderr or self.command.stdout).strip()[-1500:]
            raise HarnessFailed(f"harness {self.harness!r}: {self.command.describe()}: {tail}")
        return self


async def run_harness(name: str, box: Any, prompt: str, *, model: str = "policy", timeout_s: float | None = None,
                      install_root: str | os.PathLike | None = None) -> HarnessResult:
    """Run harness ``name`` headless on ``prompt`` in ``box`` (the current rollout's sandbox, opened with
    ``rollout_sandbox(coordinator=True)``) to its end or ``timeout_s``.

    The harness's model calls go to the current rollout through the sandbox's coordinator address, with the
    rollout's token; the rollout is marked so the coordinator stores the tools the harness ran from the
    conversation (``CompletionReport.tool_calls_from_wire``). The harness is installed first if needed
    (``install_harness``); its folder must be visible in the sandbox (``advanced.sandbox.ro_paths``).
    """
    harness = HARNESSES.get(name)
    ctx = current_rollout()
    if ctx is None:
        raise RuntimeError(f"run_harness({name!r}): no rollout in scope; call it inside a @rollout agent")
    if not box.coordinator_url:
        raise RuntimeError(f"run_harness({name!r}): the sandbox cannot reach the coordinator; open it with "
                           "rollout_sandbox(coordinator=True)")
    bin_dir = await asyncio.to_thread(install_harness, harness, install_root)
    _check_visible(box, bin_dir)
    base_url = rollout_base_urls(box.coordinator_url, ctx.rollout_id)[harness.family]
    launch = harness.launch(HarnessCall(prompt, base_url, ctx.token, model, box.home))
    for path, text in launch.files.items():
        await box.write_file(path, text)
    ctx.tool_calls_from_wire = True  # set before it runs: a harness killed midway still ran what the wire shows
    env = {"PATH": f"{bin_dir}:{SANDBOX_PATH}", **launch.env}
    argv = [str(bin_dir / launch.argv[0]), *launch.argv[1:]]
    command = await box.run(argv, timeout_s=timeout_s, env=env, cwd=box.workdir)
    return HarnessResult(name, command)


def _check_visible(box: Any, bin_dir: Path) -> None:
    """A sandbox with a read-only system view must have the harness folder among its ``ro_paths``."""
    if not box.uses_relay:  # tempdir: commands are host processes and see every path
        return
    paths = [Path(p) for p in box.settings.ro_paths]
    if not any(bin_dir == p or p in bin_dir.parents for p in paths):
        raise RuntimeError(
            f"harness folder {bin_dir.parent.parent} is not visible in the sandbox: add it (or a folder above it) "
            f"to advanced.sandbox.ro_paths, got {[str(p) for p in paths]}"
        )


__all__ = ["HarnessFailed", "HarnessResult", "run_harness"]
