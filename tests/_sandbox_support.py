"""Shared by the sandbox tests: a root folder other uids can pass through, and finding processes by a marker."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from mtrl_runtime.sandboxes import Sandboxes


def sandbox_root() -> Iterator[Path]:
    """A root folder under the system temp dir (mode 0711: under root each sandbox runs as its own uid)."""
    root = Path(tempfile.mkdtemp(prefix="mtrl-test-sandboxes-"))
    os.chmod(root, 0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def require(kind: str, **settings: object) -> None:
    """Skip, with the reason, where this kind cannot make a sandbox on this machine."""
    reason = Sandboxes({"kind": kind, **settings}).unavailable()
    if reason is not None:
        pytest.skip(reason)


def processes_with(marker: str) -> list[int]:
    """The pids of live processes whose command line holds ``marker`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found
