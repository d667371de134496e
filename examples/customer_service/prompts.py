"""Chat messages for one ticket: the policy as system prompt, an optional worked example, the ticket.

The tool definitions are not in these messages: the agent binds the tools
and the chat template renders them.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Mapping

from .data import example_instance
from .solver import solve

POLICY_PATH = Path(__file__).resolve().parent / "policy.md"


@functools.lru_cache(maxsize=1)
def policy_text() -> str:
    """The support policy as committed in policy.md."""
    return POLICY_PATH.read_text(encoding="utf-8").strip()


def system_prompt() -> str:
    """The system message: role and policy."""
    return f"You are a customer support agent.\n{policy_text()}"


@functools.lru_cache(maxsize=1)
def _example() -> tuple[dict[str, Any], ...]:
    example = example_instance()
    return ({"role": "user", "content": example["prompt"]}, *solve(example).messages)


def example_messages() -> list[dict[str, Any]]:
    """The worked example as earlier chat turns: ticket, tool calls and results, final answer."""
    return copy.deepcopy(list(_example()))


def _ticket(instance: Mapping[str, Any] | Any) -> str:
    """The ticket text of an instance row (a dict) or of a Task (its ``prompt``)."""
    prompt = instance.get("prompt") if isinstance(instance, Mapping) else getattr(instance, "prompt", None)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"instance has no prompt text; got {prompt!r}")
    return prompt


def build_messages(instance: Mapping[str, Any] | Any, with_examples: bool = True) -> list[dict[str, Any]]:
    """OpenAI-format messages for one ticket, ending with the ticket itself."""
    messages = [{"role": "system", "content": system_prompt()}]
    if with_examples:
        messages += example_messages()
    messages.append({"role": "user", "content": _ticket(instance)})
    return messages


__all__ = ["POLICY_PATH", "build_messages", "example_messages", "policy_text", "system_prompt"]
