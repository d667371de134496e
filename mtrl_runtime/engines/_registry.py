"""The engine registry: engine name → the module (its folder) whose ``create(model, **options)`` builds it.

Names are listed without importing any engine (``ENGINES.names()``), so
importing the registry never pulls in torch, transformers or httpx;
``create_engine`` imports the engine's module on use and is the one door
the CLI, the trainer and the stacks use. A new backend is one folder with a
``create`` factory and one line here.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from ..registry import Registry
from ..types import PolicyEngine

EngineFactory = Callable[..., PolicyEngine]
"""What an engine folder's ``create`` is: ``(model, **options) -> PolicyEngine``."""

ENGINES: Registry[str] = Registry("engine")
ENGINES.register("hf")("mtrl_runtime.engines.hf")
ENGINES.register("vllm")("mtrl_runtime.engines.vllm")
ENGINES.register("scripted")("mtrl_runtime.engines.scripted")


def create_engine(name: str, model: str | None = None, **options: Any) -> PolicyEngine:
    """Build the engine registered as ``name`` over ``model`` (a folder, hub id or alias).

    ``options`` are the engine's own keyword options (``advanced.engine_options``
    in the config); an option the engine does not know is an error naming it.
    """
    factory: EngineFactory = importlib.import_module(ENGINES.get(name)).create  # unknown: a KeyError naming the known
    try:
        inspect.signature(factory).bind(model, **options)
    except TypeError as exc:
        raise TypeError(f"engine {name!r}: {exc}") from None
    return factory(model, **options)


__all__ = ["ENGINES", "EngineFactory", "create_engine"]
