"""``Conversation``: one demonstrated agent conversation, whatever source it was imported from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..types import JSON


@dataclass(frozen=True)
class Conversation:
    """OpenAI chat-format ``messages`` (assistant ``tool_calls``, ``tool`` results) and the ``tools`` offered.

    ``source`` says where it came from (``file.jsonl:12``, an MLflow trace id,
    an OpenTelemetry trace id) so a bad one can be named.
    """

    messages: tuple[Mapping[str, JSON], ...]
    tools: tuple[Mapping[str, JSON], ...] = ()
    source: str = ""
