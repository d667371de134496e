"""The reference policy: calls the tools in the policy's order and applies the policy's rule.

It reads only tool outputs (never the fixtures or the ground truth), so
agreeing with every instance's ground truth shows each answer is derivable
from what the agent can see. Its transcript is also the prompt's worked
example and the scripted policy of the tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from mtrl_runtime.envs import Sandbox

from .reward import format_answer
from .tools import SupportSession, dispatch

Call = Callable[[str, Mapping[str, Any]], str]  # (tool name, arguments) -> result text


@dataclass(frozen=True)
class ReferenceEpisode:
    """The solver's answer, its OpenAI-format messages after the ticket, and the session's end state."""

    answer: dict[str, Any]
    messages: tuple[dict[str, Any], ...]
    session: dict[str, Any]

    @property
    def replies(self) -> tuple[dict[str, Any], ...]:
        """The assistant messages, in order: what a model must say, turn by turn."""
        return tuple(m for m in self.messages if m["role"] == "assistant")


class _Transcript:
    """Runs tool calls and records them as assistant tool_calls + tool results."""

    def __init__(self, call: Call, label: str) -> None:
        self._call, self._label = call, label
        self.messages: list[dict[str, Any]] = []

    def run(self, name: str, **arguments: Any) -> dict[str, Any]:
        call_id = f"call_{len(self.messages) // 2}"
        self.messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        result = self._call(name, arguments)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        parsed = json.loads(result)
        if "error" in parsed:
            raise RuntimeError(f"reference solver got a tool error on {self._label}: {name} -> {result}")
        return parsed


def decide(order: Mapping[str, Any], customer: Mapping[str, Any], policy: Mapping[str, Any]) -> str:
    """The policy's rule, on the three lookup results."""
    if order["days_since_delivery"] > policy["window_days"]:
        return "deny"
    if policy["remedy"] == "refund" and order["amount"] > customer["refund_limit"]:
        return "escalate"
    return policy["remedy"]


def solve(instance: Mapping[str, Any], session: SupportSession | None = None) -> ReferenceEpisode:
    """Follow the policy for one instance row (the ids in its ``data``) and return the episode."""
    if session is None:
        with Sandbox(f"solver-{instance.get('id', 'instance')}") as sandbox:
            return solve(instance, SupportSession(sandbox))
    data = instance["data"]
    steps = _Transcript(lambda name, args: dispatch(session, name, args), str(instance.get("id")))
    order = steps.run("lookup_order", order_id=data["order_id"])
    customer = steps.run("lookup_customer", customer_id=data["customer_id"])
    policy = steps.run("lookup_policy", issue=data["issue"])
    case = steps.run("open_case", order_id=data["order_id"])
    resolution = decide(order, customer, policy)
    refund = 0
    if resolution == "refund":
        refund = steps.run("issue_refund", case_id=case["case_id"], amount=order["amount"])["refunded"]
    answer = {"resolution": resolution, "refund_amount": refund, "case_id": case["case_id"]}
    final = {"role": "assistant", "content": format_answer(answer)}
    return ReferenceEpisode(answer=answer, messages=(*steps.messages, final), session=session.snapshot())


__all__ = ["ReferenceEpisode", "decide", "solve"]
