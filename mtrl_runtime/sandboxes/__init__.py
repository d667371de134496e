"""Sandboxes: where a rollout's code runs, one per rollout, isolated, time-limited, removed at the end.

- ``Sandboxes(settings)``: a run's provider (``advanced.sandbox`` in the
  config); ``open(name, coordinator=..., timeout_s=...)`` /
  ``sandbox(...)`` give a ``types.Sandbox``: ``run`` a command (timeout,
  output cap), ``start`` a long-lived process, ``read_file`` /
  ``write_file`` / ``list_files`` through the sandbox, ``close``.
- ``SANDBOXES``: the kinds: ``bubblewrap`` (rootless namespaces),
  ``docker`` and ``podman`` (a container of an image you name), ``tempdir``
  (no isolation; warns).
- ``rollout_sandbox()``: the current rollout's sandbox, from the run's
  provider (the in-process executor puts it in scope).

docs/sandboxes.md: what each kind isolates and limits, and how.
"""

from ._base import BaseSandbox, SandboxError, SandboxUnavailable
from ._bubblewrap import bwrap_argv
from ._container import exec_argv, run_argv
from ._provider import Sandboxes, sweep
from ._registry import SANDBOXES, SandboxKind
from ._scope import current_sandboxes, rollout_sandbox, sandboxes_scope
from ._settings import KINDS, SandboxSettings
from ._tempdir import SandboxIsolationWarning

__all__ = [
    "KINDS",
    "SANDBOXES",
    "BaseSandbox",
    "SandboxError",
    "SandboxIsolationWarning",
    "SandboxKind",
    "SandboxSettings",
    "SandboxUnavailable",
    "Sandboxes",
    "bwrap_argv",
    "current_sandboxes",
    "exec_argv",
    "rollout_sandbox",
    "run_argv",
    "sandboxes_scope",
    "sweep",
]
