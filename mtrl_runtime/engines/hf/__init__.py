"""The ``hf`` engine: a transformers model in-process, concurrent requests decoded in shared batches.

``_engine`` holds ``HFEngine`` and every semantic a caller relies on. Its
parts: the worker thread (``_worker``) and its job handoff (``_jobs``),
continuous batching (``_decoding``) and its KV buffers (``_kv_buffer``), sampling (``_sampling``), prefix
caching (``_prefix_cache``, ``_prefix_prefill``), LoRA folding
(``_lora_fold``), CPU attention (``_attention``) and loading (``_pretrained``).
"""

from ._engine import HFEngine, create
from ._attention import grouped_matmul_attention
from ._pretrained import auto_dtype

__all__ = ["HFEngine", "auto_dtype", "create", "grouped_matmul_attention"]
