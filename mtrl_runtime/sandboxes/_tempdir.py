"""``tempdir``: a plain folder per rollout, commands run as host processes in it. No isolation at all.

Only when asked for (``advanced.sandbox.kind: tempdir``), and it warns when
it opens: the code it runs can read and write anything the run can, reach
any network, and see every process. It keeps what needs no kernel help:
each command in a session of its own, killed with its process group at its
timeout and at the deadline, output capped, the per-process limits of
``_limits``, a cleared environment (so the run's credentials are not
handed down), and the folder removed at the end. For machines where
neither bubblewrap nor a container runtime is available, and for
debugging.
"""

from __future__ import annotations

import asyncio
import os
import signal
import warnings
from typing import Mapping, Sequence

from ._base import BaseSandbox
from ._limits import prlimit_prefix


class SandboxIsolationWarning(UserWarning):
    """A sandbox kind that isolates nothing was opened."""


WARNING = ("advanced.sandbox.kind 'tempdir' isolates nothing: commands run as this process's user, can read and "
           "write every file it can, reach any network and outlive their rollout's folder if they detach; use "
           "kind 'bubblewrap' (apt-get install bubblewrap) or 'docker' / 'podman' with an image")


class TempdirSandbox(BaseSandbox):
    """A rollout's folder on the host (module docstring)."""

    kind = "tempdir"
    uses_relay = False

    @property
    def workdir(self) -> str:  # type: ignore[override]
        return str(self.dirs.workspace)

    @property
    def home(self) -> str:  # type: ignore[override]
        return str(self.dirs.home)

    async def begin(self) -> None:
        warnings.warn(WARNING, SandboxIsolationWarning, stacklevel=3)
        await super().begin()

    def base_env(self) -> dict[str, str]:
        return {**super().base_env(), "TMPDIR": str(self.dirs.tmp)}

    def wrap(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout_s: float | None) -> list[str]:
        assignments = [f"{key}={value}" for key, value in env.items()]
        return [*prlimit_prefix(self.settings, own_uid=False), "env", "-i", "-C", cwd, *assignments, *argv]

    async def kill(self, proc: asyncio.subprocess.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


__all__ = ["SandboxIsolationWarning", "TempdirSandbox", "WARNING"]
