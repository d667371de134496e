"""The settings of a run's sandboxes: ``advanced.sandbox`` in the config, or what ``Sandboxes(...)`` is given.

Every limit applies to each sandbox; docs/sandboxes.md says how each kind
enforces it (and where one cannot be).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..validation import coerced

KINDS = ("bubblewrap", "docker", "podman", "tempdir")
"""The kinds ``SANDBOXES`` registers (a test keeps the two equal)."""

SandboxKindName = Literal["bubblewrap", "docker", "podman", "tempdir"]


class SandboxSettings(BaseModel):
    """Which sandbox each rollout gets and its limits (``advanced.sandbox``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    # bubblewrap: a rootless namespace sandbox; docker / podman: a container of `image` on the user's daemon;
    # tempdir: a plain folder with no isolation at all (only when asked for; it warns)
    kind: SandboxKindName = "bubblewrap"
    # the host folder holding each sandbox's folder; None: <system temp dir>/mtrl-sandboxes. When mtrl runs as
    # root each sandbox runs as a uid of its own, which must be able to reach this folder
    root: str | None = None
    image: str | None = None  # docker / podman: the image to run (it must have sh, coreutils, and python3 to reach
    # the coordinator)
    timeout_s: float = Field(default=120.0, gt=0.0)  # a command's limit when the call names none
    output_bytes: int = Field(default=64 * 1024, ge=1024)  # kept per output stream of a command; the rest is dropped
    read_bytes: int = Field(default=1024 * 1024, ge=1024)  # the largest file read_file returns
    memory_mb: int | None = Field(default=2048, ge=16)  # bubblewrap/tempdir: writable memory per process
    # (RLIMIT_DATA); docker/podman: the container's memory (--memory)
    cpu_s: int | None = Field(default=600, ge=1)  # CPU seconds per process (RLIMIT_CPU)
    cpus: float | None = Field(default=None, gt=0.0)  # docker/podman: CPUs of the container (--cpus)
    max_processes: int | None = Field(default=256, ge=8)  # docker/podman: --pids-limit; bubblewrap/tempdir
    # under root: RLIMIT_NPROC of the sandbox's own uid (rootless: not enforced)
    max_file_mb: int | None = Field(default=1024, ge=1)  # the largest file a process may write (RLIMIT_FSIZE)
    open_files: int = Field(default=4096, ge=64)  # RLIMIT_NOFILE
    ro_paths: list[str] = Field(default_factory=list)  # more host paths visible read-only at the same path
    env: dict[str, str] = Field(default_factory=dict)  # set in every command (after the sandbox's own)
    python: str = "python3"  # the interpreter inside that runs the coordinator relay
    start_timeout_s: float = Field(default=300.0, gt=0.0)  # docker/podman: starting the container (a pull)
    uid_base: int = Field(default=200_000, ge=1000)  # under root: sandboxes run as uids from here ...
    uid_count: int = Field(default=50_000, ge=1)  # ... this many

    @model_validator(mode="after")
    def _kind_needs(self) -> "SandboxSettings":
        if self.kind in ("docker", "podman") and not self.image:
            raise ValueError(f"image: kind {self.kind!r} runs a container of an image you name; set image "
                             "(e.g. python:3.12-slim), got none")
        for path in self.ro_paths:
            if not path.startswith("/"):
                raise ValueError(f"ro_paths: {path!r} is not an absolute path")
        return self

    @classmethod
    def coerce(cls, value: "SandboxSettings | Mapping[str, Any] | None") -> "SandboxSettings":
        """Settings from settings (copied), a mapping (validated, errors naming the key) or None (defaults)."""
        return coerced(cls, value, error=ValueError, prefix="sandbox settings: ")


__all__ = ["KINDS", "SandboxKindName", "SandboxSettings"]
