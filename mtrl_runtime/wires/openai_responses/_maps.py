"""OpenAI Responses' end states, once for both directions: a reply cut short is ``status: "incomplete"`` with
``incomplete_details.reason``; a finished one is ``completed`` (its chat finish reason ``tool_calls`` when it
holds calls, else ``stop``)."""

from __future__ import annotations

from .._shared import FinishReasons

# (incomplete_details.reason, chat finish reason); a chat reason with none here (stop, tool_calls) is completed
INCOMPLETE = FinishReasons((("max_output_tokens", "length"), ("content_filter", "content_filter")), default="")

__all__ = ["INCOMPLETE"]
