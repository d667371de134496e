"""The ``vllm`` engine: a vLLM OpenAI server subprocess (``_server``), token ids in and out (``_wire``).

``_engine`` holds ``VLLMEngine``; its async state lives on one event loop
thread of its own (``_loop``).
"""

from ._engine import VLLMEngine, VLLMRequestError, VLLMServerError, create
from ._wire import completion_body

__all__ = ["VLLMEngine", "VLLMRequestError", "VLLMServerError", "completion_body", "create"]
