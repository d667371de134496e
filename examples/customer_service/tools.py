"""The support tools: three read-only lookups replayed from fixtures, two session tools on per-episode state.

- ``lookup_order``, ``lookup_customer``, ``lookup_policy`` are
  :class:`mtrl_runtime.envs.ReplayTool` s over the committed fixtures: same
  arguments, same row, every episode; an unknown id is an error *result*.
- ``open_case`` and ``issue_refund`` act on a :class:`SupportSession`, the
  state of one ticket kept in a :class:`mtrl_runtime.envs.Sandbox` that is
  opened when the episode starts and torn down when it ends. One case per
  ticket; at most one refund, of exactly the order's amount, within the
  customer's refund limit. Misuse is an error result the model reads.

Framework-free: ``dispatch`` runs any tool by name (the reference solver
uses it); ``agent.py`` wraps the same tools for LangGraph.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from mtrl_runtime.envs import ReplayTool, Sandbox, SandboxError, to_json

from .data import case_id_for

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
LOOKUP_TOOLS = ("lookup_order", "lookup_customer", "lookup_policy")
SESSION_TOOLS = ("open_case", "issue_refund")
TOOL_ORDER = LOOKUP_TOOLS + SESSION_TOOLS  # the order the policy calls them in

Result = dict[str, Any]


@functools.lru_cache(maxsize=4)
def lookup_tools(root: Path = FIXTURES_DIR) -> Mapping[str, ReplayTool]:
    """The read-only tools over one fixture folder (read once; sharing them between episodes is safe)."""
    root = Path(root)
    tools = (
        ReplayTool.from_json(root / "orders.jsonl", "lookup_order", ["order_id"],
                             description="Look up an order: customer_id, item, amount, days_since_delivery.",
                             field_descriptions={"order_id": "order id from the ticket, e.g. O1000"}),
        ReplayTool.from_json(root / "customers.jsonl", "lookup_customer", ["customer_id"],
                             description="Look up a customer: tier and refund_limit.",
                             field_descriptions={"customer_id": "customer id, e.g. C100"}),
        ReplayTool.from_json(root / "policies.jsonl", "lookup_policy", ["issue"],
                             description="Look up the policy for an issue: remedy and window_days.",
                             field_descriptions={"issue": "issue from the ticket, e.g. damaged"}),
    )
    return MappingProxyType({tool.name: tool for tool in tools})


class SupportSession:
    """One ticket's case, kept in the episode's sandbox: opened once, refunded at most once.

    ``snapshot()`` is what the reward reads to check what the agent *did*
    (the refund it issued), not only what it said.
    """

    def __init__(self, sandbox: Sandbox, lookups: Mapping[str, ReplayTool] | None = None) -> None:
        self.sandbox = sandbox
        self._lookups = lookups if lookups is not None else lookup_tools()

    def open_case(self, order_id: Any = None, **unknown: Any) -> Result:
        """Open the support case for an order; one case per ticket."""
        if unknown:
            return _unknown("open_case", unknown, "order_id")
        order = self._lookups["lookup_order"](order_id=order_id)
        if "error" in order:
            return order
        state = self._state()
        case = state.get("case")
        if case is not None:
            return {"error": f"case {case['case_id']} is already open for order {case['order_id']}"}
        customer = self._lookups["lookup_customer"](customer_id=order["customer_id"])
        case = {"case_id": case_id_for(order["order_id"]), "order_id": order["order_id"],
                "amount": order["amount"], "refund_limit": customer["refund_limit"], "refunded": 0}
        state["case"] = case
        return {"case_id": case["case_id"], "order_id": case["order_id"], "status": "open"}

    def issue_refund(self, case_id: Any = None, amount: Any = None, **unknown: Any) -> Result:
        """Refund the order of the open case: exactly its amount, within the refund limit, once."""
        if unknown:
            return _unknown("issue_refund", unknown, "case_id, amount")
        case = self._state().get("case")
        if case is None:
            return {"error": "no open case: call open_case first"}
        if not isinstance(case_id, str) or case_id.strip().upper() != case["case_id"]:
            return {"error": f"no open case {case_id!r}; the open case is {case['case_id']}"}
        value = _whole_number(amount)
        if value is None:
            return {"error": f"amount must be a whole number, got {amount!r}"}
        if case["refunded"]:
            return {"error": f"case {case['case_id']} was already refunded {case['refunded']}"}
        if value != case["amount"]:
            return {"error": f"amount must be the order amount {case['amount']}, got {value}"}
        if value > case["refund_limit"]:
            return {"error": f"amount {value} is over the refund limit {case['refund_limit']}; escalate instead"}
        case["refunded"] = value
        return {"case_id": case["case_id"], "refunded": value, "status": "refunded"}

    def snapshot(self) -> Result:
        """What the episode did: the case opened (or None) and the amount refunded."""
        case = self.sandbox.state.get("case")
        if case is None:
            return {"case_id": None, "order_id": None, "refunded": 0}
        return {"case_id": case["case_id"], "order_id": case["order_id"], "refunded": case["refunded"]}

    def _state(self) -> dict[str, Any]:
        if self.sandbox.closed:
            raise SandboxError(f"session {self.sandbox.rollout_id!r} was torn down ({self.sandbox.end_reason})")
        return self.sandbox.state


def _unknown(name: str, unknown: Mapping[str, Any], expected: str) -> Result:
    return {"error": f"unknown argument {', '.join(map(repr, sorted(unknown)))} for {name}; expected {expected}"}


def _whole_number(value: Any) -> int | None:
    """40, 40.0 and "40" as 40; anything else (booleans, fractions, words) as None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


_SESSION_PARAMETERS: Mapping[str, dict[str, Any]] = MappingProxyType({
    "open_case": {
        "type": "object",
        "properties": {"order_id": {"type": "string", "description": "order id from the ticket"}},
        "required": ["order_id"],
    },
    "issue_refund": {
        "type": "object",
        "properties": {"case_id": {"type": "string", "description": "case id from open_case"},
                       "amount": {"type": "integer", "description": "the order amount"}},
        "required": ["case_id", "amount"],
    },
})


def tool_specs() -> tuple[dict[str, Any], ...]:
    """Every tool as ``{"name", "description", "parameters"}``, in the policy's order."""
    specs = [tool.spec for tool in lookup_tools().values()]
    for name in SESSION_TOOLS:
        doc = getattr(SupportSession, name).__doc__ or ""
        specs.append({"name": name, "description": doc.split("\n")[0].strip(),
                      "parameters": dict(_SESSION_PARAMETERS[name])})
    return tuple(specs)


def dispatch(session: SupportSession, name: str, arguments: Mapping[str, Any] | str | None) -> str:
    """Run tool ``name`` with ``arguments`` (a dict or its JSON text); the result as the JSON text a model reads."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return to_json({"error": f"arguments for {name} are not valid JSON: {arguments!r}"})
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, Mapping):
        return to_json({"error": f"arguments for {name} must be a JSON object, got {arguments!r}"})
    lookups = lookup_tools()
    if name in lookups:
        return to_json(lookups[name](**arguments))
    if name in SESSION_TOOLS:
        return to_json(getattr(session, name)(**arguments))
    return to_json({"error": f"unknown tool {name!r}; known: {', '.join(TOOL_ORDER)}"})


__all__ = [
    "FIXTURES_DIR",
    "LOOKUP_TOOLS",
    "SESSION_TOOLS",
    "TOOL_ORDER",
    "SupportSession",
    "dispatch",
    "lookup_tools",
    "tool_specs",
]
