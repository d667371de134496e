"""The ``hf`` engine: a transformers model in-process, concurrent requests decoded in shared batches.

``_engine`` holds ``HFEngine`` and every semantic a caller relies on. Its
parts: the worker thread (``_worker``) and its job handoff (``_jobs``),
continuous batching (``_decoding``), its KV buffers (``_kv_buffer``) and the prompt prefix its rows
hold once (``_shared_prefix``), sampling (``_sampling``), prefix
caching (``_prefix_cache``, ``_prefix_prefill``), LoRA folding
(``_lora_fold``), CPU attention (``_attention``) and loading (``_pretrained``).
"""

from ._engine import HFEngine, create
from ._attention import grouped_matmul_attention
from ._pretrained import auto_dtype
from ._shared_prefix import HeldPrefixes, SharedPrefix, shared_prefix_attention

__all__ = ["HFEngine", "HeldPrefixes", "SharedPrefix", "auto_dtype", "create", "grouped_matmul_attention", "shared_prefix_attention"]
