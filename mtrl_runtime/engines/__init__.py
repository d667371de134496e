"""Policy engines: the registry, the ``hf`` and ``vllm`` engines, the ``scripted`` test double, model resolution.

``create_engine(name, model, **options)`` builds any registered engine;
``resolve_model`` turns a model spec into a local Hugging Face folder.
"""

from ._loading import ModelNotFoundError, atomic_folder, default_cache_dir, resolve_model
from ._jobs import EngineClosedError, EngineStats
from ._registry import ENGINES, EngineFactory, create_engine
from .hf import HFEngine
from .scripted import ScriptedEngine, ScriptedFailure, ScriptedReply, ScriptExhausted, scripted_logprob
from .vllm import VLLMEngine, VLLMRequestError, VLLMServerError

__all__ = [
    "ENGINES",
    "EngineClosedError",
    "EngineFactory",
    "EngineStats",
    "HFEngine",
    "ModelNotFoundError",
    "ScriptExhausted",
    "ScriptedEngine",
    "ScriptedFailure",
    "ScriptedReply",
    "VLLMEngine",
    "VLLMRequestError",
    "VLLMServerError",
    "atomic_folder",
    "create_engine",
    "default_cache_dir",
    "resolve_model",
    "scripted_logprob",
]
