"""The kinds of sandbox, by name: ``SANDBOXES``. A new kind is one module and one entry here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..registry import Registry
from . import _bubblewrap, _container
from ._base import BaseSandbox
from ._limits import enforced
from ._settings import SandboxSettings
from ._tempdir import TempdirSandbox


@dataclass(frozen=True)
class SandboxKind:
    """One kind: its sandbox class, why it cannot run here (None: it can), and how to find what dead runs left."""

    name: str
    sandbox: type[BaseSandbox]
    unavailable: Callable[[SandboxSettings, int | None], str | None]  # (settings, the uid it would run as)
    own_uid: bool  # under root, each sandbox runs as a uid of its own
    enforced: Callable[[SandboxSettings, bool], dict[str, str]]  # (settings, own uid) -> each limit, in words
    sweep: Callable[[], list[str]] = lambda: []  # leftovers outside the sandbox folders (containers)


SANDBOXES: Registry[SandboxKind] = Registry("sandbox kind")

for _kind in (
    SandboxKind("bubblewrap", _bubblewrap.BubblewrapSandbox, _bubblewrap.unavailable_reason, own_uid=True,
                enforced=lambda s, own: enforced(s, own_uid=own)),
    SandboxKind("docker", _container.ContainerSandbox, lambda s, u: _container.unavailable_reason("docker"),
                own_uid=True, enforced=lambda s, own: _container.enforced(s),
                sweep=lambda: _container.sweep_containers("docker")),
    SandboxKind("podman", _container.PodmanSandbox, lambda s, u: _container.unavailable_reason("podman"),
                own_uid=True, enforced=lambda s, own: _container.enforced(s),
                sweep=lambda: _container.sweep_containers("podman")),
    SandboxKind("tempdir", TempdirSandbox, lambda s, u: None, own_uid=False,
                enforced=lambda s, own: {**enforced(s, own_uid=False, detached_escape=True),
                                         "isolation": "none: files, network and processes of the host are reachable"}),
):
    SANDBOXES.register(_kind.name)(_kind)

__all__ = ["SANDBOXES", "SandboxKind"]
