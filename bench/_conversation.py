"""An aircraft-inspection episode for the engine benchmarks: its messages, the prompt builder's state, and
the prompt of its next turn, each turn's reply followed by a short tool result."""

from __future__ import annotations

from typing import Any

from mtrl_examples.aircraft_inspection import TOOL_SPECS, build_messages
from mtrl_runtime.chat import PromptBuilder

TOOL_RESULT = '<tool_response>\n{"status": "ok", "step": %d, "finding": "no defect recorded"}\n</tool_response>'


class Conversation:
    """One episode: its messages, the builder's state, and the prompt of its next turn."""

    def __init__(self, builder: PromptBuilder, instance: dict[str, Any]) -> None:
        self.builder = builder
        self.messages = build_messages(instance)
        self.state = None
        self.plan = builder.build(None, self.messages, TOOL_SPECS)

    def advance(self, completion_ids: tuple[int, ...], finish_reason: str, turn: int) -> None:
        """Append the reply and a short tool result; the next prompt extends this one token-in-token-out."""
        reply = {"role": "assistant", "content": self.builder.renderer.decode(completion_ids)}
        self.state = self.builder.advance(self.state, self.plan, self.messages, TOOL_SPECS, completion_ids,
                                          finish_reason, reply)
        self.messages = [*self.messages, reply, {"role": "user", "content": TOOL_RESULT % turn}]
        self.plan = self.builder.build(self.state, self.messages, TOOL_SPECS)
        if self.plan.break_reason is not None:
            raise RuntimeError(f"turn {turn}: the prompt did not extend the previous one ({self.plan.break_reason})")
