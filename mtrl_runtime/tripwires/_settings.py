"""``advanced.tripwires``: the wires a run checks, what a trip does to the reward, and when trips stop the run.

    advanced:
      tripwires:
        wires:
          - {kind: forbidden_call, name: no_answer_key, tool: lookup_sign_off}
          - {kind: honeypot, name: ledger, value: SIGNOFF-LEDGER}
          - {kind: answer_leak, name: leak, allowed_tools: [file_report]}
        code: [examples.aircraft_inspection.hacked:TRIPWIRES]   # wires written next to the environment
        on_trip: zero        # zero: the tripped rollout's reward becomes 0 (its own kept as agent_reward); keep
        stop_rate: 0.25      # a step with more than this share of rollouts tripped stops the run (null: never)

Every field is checked at load; a wire's bad value or a ``code`` entry that
does not import is an error naming the field and the value.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._wires import WIRE_KINDS, AnswerLeak, AnswerWire, CallWire, ForbiddenCall, Honeypot, StateWire, Wire, _Wire


def load_code_wires(ref: str) -> tuple[Wire, ...]:
    """The wires ``module:NAME`` names (one wire, or a list/tuple of them); ValueError naming ``ref`` otherwise."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"code: {ref!r} must be 'module:NAME' (a wire, or a list of wires, next to the environment)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"code: {ref!r} does not import ({exc})") from None
    if not hasattr(module, attr):
        raise ValueError(f"code: {ref!r}: module {module_name!r} has no {attr!r}")
    found = getattr(module, attr)
    wires = tuple(found) if isinstance(found, (list, tuple)) else (found,)
    for wire in wires:
        if not isinstance(wire, (CallWire, AnswerWire, StateWire)):
            raise ValueError(f"code: {ref!r} holds {wire!r}, which is not a tripwire (check_call, check_answer "
                             "or snapshot, with a name and a kind)")
    return wires


class TripwireSettings(BaseModel):
    """The run's tripwires (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    wires: list[Annotated[ForbiddenCall | Honeypot | AnswerLeak, Field(discriminator="kind")]] = Field(
        default_factory=list)
    code: list[str] = Field(default_factory=list)
    on_trip: Literal["zero", "keep"] = "zero"
    stop_rate: float | None = Field(default=None, gt=0.0, le=1.0)

    @field_validator("wires", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        out = []
        for i, entry in enumerate(value):
            if isinstance(entry, _Wire):
                out.append(entry)
                continue
            if not isinstance(entry, dict):
                raise ValueError(f"wires[{i}]: {entry!r} must be a mapping with a kind")
            kind = entry.get("kind")
            if kind not in WIRE_KINDS:
                raise ValueError(f"wires[{i}].kind: {kind!r} is not a tripwire kind; known: "
                                 f"{', '.join(sorted(WIRE_KINDS))} (state checks are code: StateCheck)")
            try:
                out.append(WIRE_KINDS[kind].model_validate(entry))
            except Exception as exc:  # pydantic's ValidationError: name the wire and pass its reason on
                raise ValueError(f"wires[{i}] ({kind}): {_first_error(exc)}") from None
        return out

    @field_validator("code")
    @classmethod
    def _imports(cls, value: list[str]) -> list[str]:
        for ref in value:
            load_code_wires(ref)
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> "TripwireSettings":
        seen: set[str] = set()
        for wire in self.build():
            if wire.name in seen:
                raise ValueError(f"wires: the name {wire.name!r} is used twice; each wire names its metric "
                                 "rollout/tripwires/<name>")
            seen.add(wire.name)
        return self

    def build(self) -> tuple[Wire, ...]:
        """Every wire of the run: the declared ones, then the code's."""
        return tuple(self.wires) + tuple(w for ref in self.code for w in load_code_wires(ref))

    @property
    def enabled(self) -> bool:
        return bool(self.wires or self.code)


def _first_error(exc: Exception) -> str:
    errors: Sequence[dict] = getattr(exc, "errors", lambda: [])()
    if not errors:
        return str(exc)
    err = errors[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('input')!r}: {err.get('msg')}" if where else str(err.get("msg"))


__all__ = ["TripwireSettings", "load_code_wires"]
