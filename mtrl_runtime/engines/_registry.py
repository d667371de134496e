"""The engine registry: engine name → factory ``(model, **options) -> PolicyEngine``.

Each engine module registers its factory with ``@ENGINES.register("name")``;
``create_engine`` is the one door the CLI and the coordinator use. A new
backend (``vllm``) is one module with one registered factory and one import
line in the package ``__init__``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ..registry import Registry
from ..types import PolicyEngine

EngineFactory = Callable[..., PolicyEngine]

ENGINES: Registry[EngineFactory] = Registry("engine")


def create_engine(name: str, model: str | None = None, **options: Any) -> PolicyEngine:
    """Build the engine registered as ``name`` over ``model`` (a folder, hub id or alias).

    ``options`` are the engine's own keyword options (``advanced.engine_options``
    in the config); an option the engine does not know is an error naming it.
    """
    factory = ENGINES.get(name)
    try:
        inspect.signature(factory).bind(model, **options)
    except TypeError as exc:
        raise TypeError(f"engine {name!r}: {exc}") from None
    return factory(model, **options)


__all__ = ["ENGINES", "EngineFactory", "create_engine"]
