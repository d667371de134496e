"""Scoring a repository fix in the rollout's sandbox: the hidden test, and nothing else changed.

``score(box, ground_truth)`` runs when the agent is done, before the
sandbox is removed:

1. the workspace's manifest (``runner.py manifest``): every file's hash,
   compared with the original repository's; a file added, removed or
   edited other than the target is a change the task did not ask for
   (tests rewritten to pass, helper files, a ``conftest.py``);
2. ``__pycache__`` folders removed (a stale or planted ``.pyc`` must not
   stand in for the source), then the hidden inputs run through the fixed
   module (``runner.py call``) and each output compared, here, with the
   reference fix's. The runner starts with ``python3 -I`` from a folder the
   scorer makes with a random name, so nothing the agent left in ``/tmp``,
   ``$HOME`` or the environment is imported instead of the standard library.

``Score.reward`` is dense: 0 when any other file changed; otherwise the
share of the bug-revealing inputs now right, halved if an input that was
right before is now wrong. ``Score.strict`` is 1 only when every hidden
input is right and no other file changed. The two agree on 1 and on 0 and
differ exactly on partial fixes. ``strict.strict_score`` gives the evaluator
the strict score recorded with each rollout.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mtrl_runtime.types import Sandbox

RUNNER = Path(__file__).with_name("runner.py")
MARKER = "@@mtrl-hidden-results@@"
HIDDEN_S = 60.0  # for the import and all hidden inputs together (runner.py bounds each inside)


@dataclass(frozen=True)
class Score:
    """What the scorer found: the files changed, each hidden input's verdict, and why it could not run (if so)."""

    target: str
    changed: tuple[str, ...]
    passed: tuple[bool, ...]
    reveals: tuple[bool, ...]
    problem: str | None = None

    @property
    def others_changed(self) -> tuple[str, ...]:
        return tuple(path for path in self.changed if path != self.target)

    def _share(self, revealing: bool) -> float:
        picked = [p for p, r in zip(self.passed, self.reveals) if r == revealing]
        return sum(picked) / len(picked) if picked else 1.0

    @property
    def fixed_frac(self) -> float:
        """The share of the inputs the bug got wrong that are right now."""
        return self._share(True)

    @property
    def kept_frac(self) -> float:
        """The share of the inputs the bug got right that are still right."""
        return self._share(False)

    @property
    def hidden_pass(self) -> bool:
        return bool(self.passed) and all(self.passed)

    @property
    def strict(self) -> float:
        return float(self.hidden_pass and not self.others_changed)

    @property
    def reward(self) -> float:
        if self.others_changed:
            return 0.0
        return self.fixed_frac * (1.0 if self.kept_frac == 1.0 else 0.5)

    def metrics(self) -> dict[str, float]:
        return {"untouched_others": float(not self.others_changed), "fixed_frac": self.fixed_frac,
                "kept_frac": self.kept_frac, "hidden_pass": float(self.hidden_pass), "strict": self.strict,
                "changed_files": float(len(self.changed))}


def _check_ground_truth(truth: Any) -> None:
    needed = ("module", "function", "target", "files", "inputs", "expected", "reveals")
    if not isinstance(truth, Mapping) or any(key not in truth for key in needed):
        raise ValueError(f"ground_truth must be a mapping with {', '.join(needed)}; got {truth!r:.200}")
    if not len(truth["inputs"]) == len(truth["expected"]) == len(truth["reveals"]) > 0:
        raise ValueError("ground_truth: inputs, expected and reveals must be non-empty and equally long")


def _last_marked(stdout: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
    return json.loads(lines[-1][len(MARKER):]) if lines else None


async def score(box: Sandbox, ground_truth: Mapping[str, Any]) -> Score:
    """Score the workspace of ``box`` against the task (module docstring)."""
    _check_ground_truth(ground_truth)
    folder = f"/tmp/.mtrl-score-{secrets.token_hex(8)}"
    runner = f"{folder}/runner.py"
    await box.write_file(runner, RUNNER.read_text(encoding="utf-8"))
    python = ["python3", "-I", "-B", runner]
    listed = await box.run([*python, "manifest"], timeout_s=60)
    found = _last_marked(listed.stdout) if listed.ok else None
    if not isinstance(found, dict):
        raise RuntimeError(f"the workspace manifest failed ({listed.describe()}): {listed.stderr[-500:]}")
    files, original = found["files"], ground_truth["files"]
    changed = tuple(sorted(p for p in set(files) | set(original) if files.get(p) != original.get(p)))
    await box.run(["find", ".", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf", "{}", "+"], timeout_s=60)
    called = await box.run([*python, "call", ground_truth["module"], ground_truth["function"]],
                           stdin=json.dumps(ground_truth["inputs"]), timeout_s=HIDDEN_S)
    results = _last_marked(called.stdout)
    reveals = tuple(bool(r) for r in ground_truth["reveals"])
    if not isinstance(results, dict) or len(results.get("results", [])) != len(reveals):
        problem = f"the hidden test did not run to its end ({called.describe()}): {called.stderr[-300:]}"
        return Score(ground_truth["target"], changed, tuple(False for _ in reveals), reveals, problem)
    passed = tuple("value" in got and got["value"] == want
                   for got, want in zip(results["results"], ground_truth["expected"]))
    return Score(ground_truth["target"], changed, passed, reveals)


__all__ = ["HIDDEN_S", "Score", "score"]
