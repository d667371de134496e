"""Load a user's function named on the command line (``--agent``, ``--strict``): shared by train, eval and check.

``--agent`` of ``mtrl train`` and ``mtrl eval`` may also be a deployed AgentCore Runtime's ARN
(``agent_env_for``), or be left out where the config names one (``advanced.agentcore.runtime_arn``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..executors import is_arn, parse_runtime_arn

if TYPE_CHECKING:
    from ..config import MtrlConfig
    from ..evaluation import StrictScorer

AGENT_HELP = ("the agent: its entrypoint (module:function or file.py:function), or a deployed AgentCore Runtime's "
              "ARN (arn:aws:bedrock-agentcore:REGION:ACCOUNT:runtime/ID; default advanced.agentcore.runtime_arn)")


def agent_env_for(spec: str | None, config: "MtrlConfig") -> Any:
    """What ``--agent`` names: a function, or an AgentCore Runtime ARN (checked here, naming ``--agent``).

    Without ``--agent``, the config's ``advanced.agentcore.runtime_arn`` (already checked when it loaded).
    """
    if spec is None:
        arn = config.advanced.agentcore.runtime_arn
        if arn is None:
            raise ValueError("--agent: give the agent (module:function, file.py:function or an AgentCore Runtime "
                             "ARN), or set advanced.agentcore.runtime_arn in the config")
        return arn
    if is_arn(spec):
        return str(parse_runtime_arn(spec, "--agent"))
    return load_agent(spec)


def load_agent(spec: str, flag: str = "--agent") -> Any:
    """The function named by ``module:function`` or ``file.py:function`` (``flag`` names it in errors)."""
    target, name, found = _load_attribute(spec, flag)
    if not callable(found):
        raise ValueError(f"{flag}: {target!r} has no function {name!r}")
    return found


def load_strict_scorer(spec: str, threshold: float | None = None) -> "StrictScorer":
    """``--strict``: a function ``fn(final_text, ground_truth)``, or a ``StrictScorer`` (one that reads the whole
    rollout: ``StrictScorer(fn, input="rollout")``); ``threshold`` replaces the scorer's where given."""
    from ..evaluation import StrictScorer  # the evaluator's web stack loads only for commands that score

    target, name, found = _load_attribute(spec, "--strict")
    if isinstance(found, StrictScorer):
        scorer = found
    elif callable(found):
        scorer = StrictScorer(found)
    else:
        raise ValueError(f"--strict: {target!r} has no function or StrictScorer {name!r}")
    return scorer if threshold is None else dataclasses.replace(scorer, threshold=threshold)


def _load_attribute(spec: str, flag: str) -> tuple[str, str, Any]:
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{flag}: expected module:function or file.py:function, got {spec!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{flag}: no file {target!r}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        sys.path.insert(0, str(path.parent))
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(target)
    return target, name, getattr(module, name, None)


__all__ = ["AGENT_HELP", "agent_env_for", "load_agent", "load_strict_scorer"]
