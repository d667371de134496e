"""Policy engines: the registry, the ``hf`` and ``vllm`` engines, the ``scripted`` test double, model resolution.

``create_engine(name, model, **options)`` builds any registered engine;
``resolve_model`` turns a model spec into a local Hugging Face folder and
``load_tokenizer`` loads its tokenizer as ``AutoTokenizer`` does, without
importing transformers' model registry once the folder is known. Each
engine is one folder (``hf/``, ``vllm/``, ``scripted/``) with a ``create``
factory; its names below are imported on first use, so importing this
package (and listing ``ENGINES.names()``) never imports torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._loading import ModelNotFoundError, atomic_folder, default_cache_dir, mtrl_cache_root, resolve_model
from ._pool_options import POOL_OPTIONS, check_pool_options
from ._registry import ENGINES, EngineFactory, create_engine
from ._stats import EngineClosedError, EngineStats, ServerStats
from ._tokenizer import load_tokenizer

_LAZY = {  # name -> the engine folder that defines it
    "HFEngine": ".hf",
    "ScriptExhausted": ".scripted",
    "ScriptedEngine": ".scripted",
    "ScriptedFailure": ".scripted",
    "ScriptedReply": ".scripted",
    "scripted_logprob": ".scripted",
    "VLLMEngine": ".vllm",
    "VLLMRequestError": ".vllm",
    "VLLMServerError": ".vllm",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ENGINES",
    "EngineClosedError",
    "EngineFactory",
    "EngineStats",
    "HFEngine",
    "ModelNotFoundError",
    "POOL_OPTIONS",
    "ScriptExhausted",
    "ScriptedEngine",
    "ScriptedFailure",
    "ScriptedReply",
    "ServerStats",
    "VLLMEngine",
    "VLLMRequestError",
    "VLLMServerError",
    "atomic_folder",
    "check_pool_options",
    "create_engine",
    "default_cache_dir",
    "mtrl_cache_root",
    "load_tokenizer",
    "resolve_model",
    "scripted_logprob",
]
