"""The ``vllm`` engine: a vLLM OpenAI server subprocess (``_server``), token ids in and out (``_wire``).

``_engine`` holds ``VLLMEngine``; its async state lives on one event loop
thread of its own (``_loop``). Several servers (``servers: N``, ``urls``)
sit behind one ``EnginePool`` (``_pool``: per-rollout affinity, adapters on
every server, a dead server leaves rotation); ``_factory`` holds ``create``.
"""

from ._engine import VLLMEngine, VLLMRequestError, VLLMServerError
from ._factory import assign_gpus, create, create_pool, visible_gpus
from ._pool import EnginePool, PoolMember, ServerDownError, StreamingEnginePool, make_pool
from ._wire import completion_body

__all__ = ["EnginePool", "PoolMember", "ServerDownError", "StreamingEnginePool", "VLLMEngine", "VLLMRequestError",
           "VLLMServerError", "assign_gpus", "completion_body", "create", "create_pool", "make_pool", "visible_gpus"]
