"""A checklist: named checks that pass, fail (with the first fix to try) or do not apply."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # the check does not apply (e.g. no strict scorer was given)


@dataclass(frozen=True)
class CheckItem:
    """One check: what was seen (``detail``) and, when it failed, the first thing to change."""

    name: str
    status: Status
    detail: str
    first_fix: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def __str__(self) -> str:
        mark = {Status.PASS: "[PASS]", Status.FAIL: "[FAIL]", Status.SKIP: "[skip]"}[self.status]
        lines = [f"  {mark} {self.name}: {_indent(self.detail)}"]
        if self.status is Status.FAIL and self.first_fix:
            lines.append(f"         first fix: {_indent(self.first_fix)}")
        return "\n".join(lines)


def passed(name: str, detail: str, **evidence: Any) -> CheckItem:
    return CheckItem(name, Status.PASS, detail, evidence=evidence)


def failed(name: str, detail: str, first_fix: str, **evidence: Any) -> CheckItem:
    return CheckItem(name, Status.FAIL, detail, first_fix, evidence)


def skipped(name: str, detail: str) -> CheckItem:
    return CheckItem(name, Status.SKIP, detail)


@dataclass(frozen=True)
class Checklist:
    """The checks of one ``mtrl check`` run, in the order they were made."""

    title: str
    items: tuple[CheckItem, ...]

    @property
    def ok(self) -> bool:
        return all(i.status is not Status.FAIL for i in self.items)

    @property
    def failures(self) -> tuple[CheckItem, ...]:
        return tuple(i for i in self.items if i.status is Status.FAIL)

    def item(self, name: str) -> CheckItem:
        for i in self.items:
            if i.name == name:
                return i
        raise KeyError(f"no check named {name!r}; checks: {', '.join(i.name for i in self.items)}")

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "ok": self.ok, "items": [
            {"name": i.name, "status": i.status.value, "detail": i.detail, "first_fix": i.first_fix,
             "evidence": dict(i.evidence)} for i in self.items]}

    def __str__(self) -> str:
        counts = {s: sum(i.status is s for i in self.items) for s in Status}
        head = (f"{self.title}: {counts[Status.PASS]} passed, {counts[Status.FAIL]} failed"
                + (f", {counts[Status.SKIP]} skipped" if counts[Status.SKIP] else ""))
        return "\n".join([head, *(str(i) for i in self.items)])


def _indent(text: str) -> str:
    return text.replace("\n", "\n         ")


__all__ = ["CheckItem", "Checklist", "Status", "failed", "passed", "skipped"]
