"""Harness CLIs installed from the npm registry, pinned, once per version, in a folder of their own."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

from ._spec import Harness


class HarnessInstallError(RuntimeError):
    """npm could not install a harness; names the command and what npm said."""


def harness_root(root: str | os.PathLike | None = None) -> Path:
    """Where harnesses are installed: ``root``, else ``$MTRL_HARNESS_DIR``, else ``~/.cache/mtrl/harnesses``."""
    if root is not None:
        return Path(root)
    env = os.environ.get("MTRL_HARNESS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "mtrl" / "harnesses"


_lock = threading.Lock()  # one npm install at a time in this process (npm's own cache is not safe for two)


def install_harness(harness: Harness, root: str | os.PathLike | None = None, *, timeout_s: float = 900.0) -> Path:
    """The folder holding ``harness``'s command (``node_modules/.bin``), installing it first if needed."""
    prefix = harness_root(root) / f"{harness.name}-{harness.version}"
    bin_dir = prefix / "node_modules" / ".bin"
    if (bin_dir / harness.binary).exists():
        return bin_dir
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessInstallError(f"harness {harness.name!r}: npm is not on PATH; install Node.js 20 or newer")
    command = [npm, "install", "--prefix", str(prefix), "--no-fund", "--no-audit", "--loglevel", "error",
               f"{harness.package}@{harness.version}"]
    with _lock:
        if (bin_dir / harness.binary).exists():
            return bin_dir
        prefix.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise HarnessInstallError(f"harness {harness.name!r}: {' '.join(command)} ran past {timeout_s:g} s") from None
        if done.returncode != 0 or not (bin_dir / harness.binary).exists():
            raise HarnessInstallError(
                f"harness {harness.name!r}: {' '.join(command)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
    return bin_dir


__all__ = ["HarnessInstallError", "harness_root", "install_harness"]
