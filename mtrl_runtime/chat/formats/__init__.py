"""Chat formats as a registry: one module per model family, each a ``ChatFormat``.

``CHAT_FORMATS`` maps a name (the config's ``advanced.chat_format``) to its
format; ``detect_format`` picks one from a tokenizer's special tokens and
template (most specific first: a Qwen3-Coder tokenizer also has ChatML's
tokens, a Qwen3.5 template also writes Qwen3-Coder's calls);
``resolve_format`` is what startup calls: the configured name, else the
detected one, else an error naming the model and the choices. Adding a
format is one module here and one line in ``_FORMATS``.
"""

from __future__ import annotations

from typing import Any

from ...registry import Registry
from ._base import ChatFormat, ReasoningHistory, opened_reasoning
from ._drift import SegmentDrift, drift_fraction, segment_drift, segments_drift_fraction
from .deepseek_v3 import DEEPSEEK_V3
from .gemma4 import GEMMA4
from .harmony import HARMONY
from .hermes import HERMES, QWEN3_TEMPLATE
from .llama3_json import LLAMA3_JSON
from .mistral import MISTRAL
from .qwen3_5 import QWEN3_5
from .qwen3_coder import QWEN3_CODER

# detection order: the most specific markers first (Qwen3.5/3.6 write Qwen3-Coder's <function= calls and think;
# both have ChatML's tokens, which alone mean hermes)
_FORMATS: tuple[ChatFormat, ...] = (HARMONY, GEMMA4, DEEPSEEK_V3, MISTRAL, LLAMA3_JSON, QWEN3_5, QWEN3_CODER, HERMES)

CHAT_FORMATS: Registry[ChatFormat] = Registry("chat format")
for _fmt in _FORMATS:
    CHAT_FORMATS.register(_fmt.name)(_fmt)


def detect_format(tokenizer: Any) -> ChatFormat | None:
    """The format ``tokenizer`` belongs to, from its special tokens and template; None when none matches."""
    for fmt in _FORMATS:
        if fmt.detect(tokenizer):
            return fmt
    return None


def resolve_format(tokenizer: Any, name: str | None, model: str = "") -> ChatFormat:
    """The format named in the config, else the detected one; an undetectable model with no name is an error."""
    if name is not None:
        return CHAT_FORMATS.get(name)
    fmt = detect_format(tokenizer)
    if fmt is None:
        raise ValueError(
            f"cannot tell the chat format of model {model or type(tokenizer).__name__!r} from its tokenizer "
            f"(no known special tokens or template markers); set advanced.chat_format to one of: "
            f"{', '.join(CHAT_FORMATS.names())}"
        )
    return fmt


__all__ = [
    "CHAT_FORMATS",
    "QWEN3_TEMPLATE",
    "ChatFormat",
    "ReasoningHistory",
    "SegmentDrift",
    "detect_format",
    "drift_fraction",
    "opened_reasoning",
    "resolve_format",
    "segment_drift",
    "segments_drift_fraction",
]
