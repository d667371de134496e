"""Environment toolkit: one small helper per pattern an agent acts on, plus the checks.

- Read-only tools replayed from fixtures: ``ReplayTool``.
- Stateful tools in a per-episode sandbox: ``Sandbox``, ``SandboxPool``.
- Verifiable outcomes: ``SqliteEnv`` (one in-memory database per rollout),
  ``result_sets_equal``, ``safe_eval``.
- Checks: ``check_determinism``, ``check_isolation``, ``describe_tools``.

Tools are plain callables with ``name``, ``description``, ``parameters`` and
``spec``; ``tool.as_function()`` gives an ordinary keyword function to wrap
with Strands' ``@tool`` or LangChain's ``StructuredTool.from_function``.
"""

from ._checks import (
    DEFAULT_IGNORED_FIELDS,
    DiffReport,
    IsolationReport,
    MessageDiff,
    check_determinism,
    check_determinism_async,
    check_isolation,
    describe_tools,
    diff_messages,
)
from ._replay import ReplayTool, normalize_key
from ._safe_math import MAX_EXPONENT, MAX_INT_BITS, safe_eval
from ._sandbox import Sandbox, SandboxError, SandboxPool, SandboxTeardownError
from ._sqlite_env import SqliteDatabase, SqliteEnv, SqlQueryTool, result_sets_equal
from ._tooling import as_function, to_json

__all__ = [
    "DEFAULT_IGNORED_FIELDS",
    "DiffReport",
    "IsolationReport",
    "MAX_EXPONENT",
    "MAX_INT_BITS",
    "MessageDiff",
    "ReplayTool",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxTeardownError",
    "SqlQueryTool",
    "SqliteDatabase",
    "SqliteEnv",
    "as_function",
    "check_determinism",
    "check_determinism_async",
    "check_isolation",
    "describe_tools",
    "diff_messages",
    "normalize_key",
    "result_sets_equal",
    "safe_eval",
    "to_json",
]
