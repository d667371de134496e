"""The reference policy: calls the tools in the SOP's order and applies the SOP's rules.

It reads only tool outputs (never the fixtures or the ground truth), so
agreeing with every instance's ground truth shows each answer is derivable
from what the agent can see. Its transcript is also the prompt's worked example.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .reward import FIELDS, check_fields, format_answer
from .tools import InspectionSession, parse_kv

Call = Callable[[str, Mapping[str, Any]], str]  # (tool name, arguments) -> result line


@dataclass(frozen=True)
class ReferenceEpisode:
    """The solver's answer (all six fields) and its OpenAI-format messages after the user request."""

    answer: dict[str, Any]
    messages: tuple[dict[str, Any], ...]


class _Transcript:
    """Runs tool calls and records them as assistant tool_calls + tool results."""

    def __init__(self, call: Call, label: str) -> None:
        self._call, self._label = call, label
        self.messages: list[dict[str, Any]] = []

    def run(self, name: str, **arguments: Any) -> dict[str, str]:
        call_id = f"call_{len(self.messages) // 2}"
        self.messages.append({"role": "assistant", "content": step_line(len(self.messages) // 2 + 1, name),
                              "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        result = self._call(name, arguments)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        if result.startswith("error:"):
            raise RuntimeError(f"reference solver got a tool error on {self._label}: {name} -> {result}")
        return parse_kv(result)


def step_line(number: int, action: str) -> str:
    """The line an assistant turn opens with, ``Step 3: inspect_mechanical``: the SOP asks for it.

    Numbered steps are the shaping that gives SmolLM2-135M its foothold: with
    them in the worked example it makes each SOP call and then answers,
    instead of calling tools forever (see the example's README).
    """
    return f"Step {number}: {action}"


def _true(value: str) -> bool:
    return value == "true"


def solve(instance: Mapping[str, Any], fields: Sequence[str] = FIELDS, call: Call | None = None) -> ReferenceEpisode:
    """Follow the SOP for one instance row (its ``data.tail_number``) and return the episode.

    ``call`` runs a tool (default: a fresh :class:`InspectionSession`'s).
    """
    fields = check_fields(fields)
    tail = instance["data"]["tail_number"]
    steps = _Transcript(call or InspectionSession().call, str(instance.get("id", tail)))
    answer: dict[str, Any] = {
        "aircraft_valid": _true(steps.run("validate_aircraft", tail_number=tail)["aircraft_valid"]),
        "maintenance_due": _true(steps.run("get_maintenance_record", tail_number=tail)["maintenance_due"]),
        "mechanical_status": steps.run("inspect_mechanical", tail_number=tail)["mechanical_status"],
        "electrical_status": steps.run("inspect_electrical", tail_number=tail)["electrical_status"],
        "incident_flag": _true(steps.run("check_incidents", tail_number=tail)["incident_flag"]),
    }
    release = (answer["aircraft_valid"] and not answer["maintenance_due"]
               and answer["mechanical_status"] == "pass" and answer["electrical_status"] == "pass"
               and not answer["incident_flag"])
    answer["decision"] = "release" if release else "ground"
    steps.run("file_report", tail_number=tail)
    final = {"role": "assistant",
             "content": f"{step_line(len(steps.messages) // 2 + 1, 'answer')}\n{format_answer(answer, fields)}"}
    return ReferenceEpisode(answer=answer, messages=(*steps.messages, final))


__all__ = ["ReferenceEpisode", "parse_kv", "solve", "step_line"]
