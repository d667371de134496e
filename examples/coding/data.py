"""Deterministic generator of the repository-fix tasks: 65 small repositories, split train / val / test.

Each task is one template and theme of ``templates``: a repository of
three files (``README.md``, the module with the bug, its visible tests),
the bug report as the prompt, and, in the ground truth, the hidden test:
inputs for the function with the outputs the fixed version gives. Both
versions run on every candidate input here (with a step budget: one bug
loops forever); the inputs on which they differ "reveal" the bug. One
revealing and one agreeing input become the visible tests, which fail
before the fix and pass after it; the rest are the hidden ones, so the
hidden test checks inputs the agent never saw, and that the function still
works where it worked.

Every template is in the train split; val and test hold other themes.
Regenerate the committed files with ``python -m examples.coding``
(``--check`` only compares).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._datafiles import data_main, jsonl, read_split, stale_paths, write_files

from .templates import TEMPLATES, Args, Template, Theme, expand, separator_of

PACKAGE_DIR = Path(__file__).resolve().parent
SEED = 4646
SPLIT_SIZES: Mapping[str, int] = {"train": 45, "val": 10, "test": 10}
STEP_BUDGET = 20_000  # line events a call may take at generation before it counts as looping forever


class Looped(Exception):
    """A call ran past ``STEP_BUDGET`` (the bug loops forever on this input)."""


def _load(source: str, name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(source, f"{name}.py", "exec"), namespace)  # our own templates' code, at generation only
    return namespace


def plain(value: Any) -> Any:
    """As JSON holds it (the runner compares the same form)."""
    return json.loads(json.dumps(value, default=repr))


def outcome(function: Any, args: Args) -> dict[str, Any]:
    """``{"value": v}``, ``{"error": "Type: msg"}`` or ``{"timeout": ...}``, as ``runner.call`` reports a call."""
    steps = 0

    def budget(frame: Any, event: str, arg: Any) -> Any:
        nonlocal steps
        if event == "line":
            steps += 1
            if steps > STEP_BUDGET:
                raise Looped()
        return budget

    previous = sys.gettrace()
    sys.settrace(budget)
    try:
        return {"value": plain(function(*json.loads(json.dumps(args))))}
    except Looped:
        return {"timeout": STEP_BUDGET}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        sys.settrace(previous)


@dataclass(frozen=True)
class Repo:
    """One generated task before it is written as a row."""

    template: str
    theme: Theme
    issue: str
    files: dict[str, str]  # the workspace: README.md, the buggy module, its visible tests
    fixed: str  # the module as it should be (the reference fix; never in the workspace)
    inputs: list[list[Any]]  # the hidden inputs
    expected: list[Any]  # the fixed version's output for each
    reveals: list[bool]  # the buggy version got it wrong

    @property
    def target(self) -> str:
        return f"{self.theme.module}.py"


def _visible_tests(theme: Theme, cases: Sequence[tuple[Args, Any]]) -> str:
    lines = [
        '"""Tests of ' + theme.module + '. Run them with: python3 -m unittest"""',
        "",
        "import signal",
        "import unittest",
        "",
        f"from {theme.module} import {theme.function}",
        "",
        "",
        "def _too_slow(signum, frame):",
        '    raise AssertionError("took more than 5 seconds")',
        "",
        "",
        f"class Test{''.join(p.title() for p in theme.function.split('_'))}(unittest.TestCase):",
        "    def setUp(self):",
        "        signal.signal(signal.SIGALRM, _too_slow)",
        "        signal.alarm(5)",
        "",
        "    def tearDown(self):",
        "        signal.alarm(0)",
    ]
    for i, (args, expected) in enumerate(cases):
        call = f"{theme.function}({', '.join(repr(a) for a in args)})"
        lines += ["", f"    def test_case_{i + 1}(self):", f"        self.assertEqual({call}, {expected!r})"]
    lines += ["", "", 'if __name__ == "__main__":', "    unittest.main()", ""]
    return "\n".join(lines)


def _readme(theme: Theme, template: Template) -> str:
    return (f"# {theme.module}\n\nSmall helpers for {theme.noun}, in `{theme.module}.py`.\n\n"
            "Run the tests with `python3 -m unittest`.\n")


def make_repo(template: Template, theme: Theme, seed: int) -> Repo:
    """The task of one template and theme: both versions run on every candidate input (module docstring)."""
    buggy = template.source(theme, random.Random(seed), False)
    fixed = template.source(theme, random.Random(seed), True)
    separator = separator_of(fixed)
    candidates = [expand(template, args, separator) for args in template.inputs(random.Random(seed + 1))]
    good = _load(fixed, theme.module)[theme.function]
    bad = _load(buggy, theme.module)[theme.function]
    rows = []
    for args in candidates:
        right, wrong = outcome(good, args), outcome(bad, args)
        if "value" not in right:
            raise ValueError(f"{template.name}/{theme.module}: the fix fails on {args!r}: {right}")
        rows.append((args, right["value"], wrong != right))
    revealing = [r for r in rows if r[2]]
    agreeing = [r for r in rows if not r[2]]
    if len(revealing) < 2 or len(agreeing) < 2:
        raise ValueError(f"{template.name}/{theme.module}: {len(revealing)} revealing and {len(agreeing)} agreeing "
                         "inputs; a task needs two of each (one visible, the rest hidden)")
    visible = [agreeing[0], revealing[0]]
    hidden = [r for r in rows if r is not visible[0] and r is not visible[1]]
    files = {"README.md": _readme(theme, template), f"{theme.module}.py": buggy,
             f"test_{theme.module}.py": _visible_tests(theme, [(a, e) for a, e, _ in visible])}
    return Repo(template.name, theme, template.issue(theme), files, fixed, [list(a) for a, _, _ in hidden],
                [e for _, e, _ in hidden], [r for _, _, r in hidden])


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt(repo: Repo) -> str:
    """The task as the agent reads it: the bug report and what to change."""
    return (f"Bug report for `{repo.target}`: {repo.issue}\n\n"
            f"Fix `{repo.theme.function}` in `{repo.target}`. The repository is in /workspace.")


def instance(repo: Repo, split: str, index: int) -> dict[str, Any]:
    return {
        "id": f"coding-{split}-{index:03d}",
        "split": split,
        "prompt": prompt(repo),
        "ground_truth": {"module": repo.theme.module, "function": repo.theme.function, "target": repo.target,
                         "files": {path: sha256(text) for path, text in repo.files.items()},
                         "inputs": repo.inputs, "expected": repo.expected, "reveals": repo.reveals},
        "data": {"template": repo.template, "files": repo.files},
    }


def generate_repos(seed: int = SEED) -> dict[str, list[Repo]]:
    """Every task, by split: one theme of each template in train first, the rest shuffled into the splits."""
    rng = random.Random(seed)
    by_template: list[list[Repo]] = []
    for t_index, template in enumerate(TEMPLATES):
        repos = [make_repo(template, theme, seed * 1000 + t_index * 10 + k) for k, theme in enumerate(template.themes)]
        rng.shuffle(repos)
        by_template.append(repos)
    first = [repos[0] for repos in by_template]
    rest = [repo for repos in by_template for repo in repos[1:]]
    rng.shuffle(rest)
    ordered = first + rest
    if len(ordered) != sum(SPLIT_SIZES.values()):
        raise ValueError(f"{len(ordered)} tasks, but SPLIT_SIZES adds up to {sum(SPLIT_SIZES.values())}")
    splits, start = {}, 0
    for split, size in SPLIT_SIZES.items():
        chosen = ordered[start:start + size]
        if split == "train":
            rng.shuffle(chosen)
        splits[split] = chosen
        start += size
    return splits


def generate(seed: int = SEED) -> dict[str, str]:
    """Every committed data file as text, keyed by its path relative to this package."""
    return {f"instances/{split}.jsonl": jsonl(instance(repo, split, i) for i, repo in enumerate(repos))
            for split, repos in generate_repos(seed).items()}


def write(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[Path]:
    return write_files(generate(seed), root)


def stale_files(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[str]:
    return stale_paths(generate(seed), root)


def load_instances(split: str, root: Path = PACKAGE_DIR) -> list[dict[str, Any]]:
    """The committed tasks of one split (train, val or test)."""
    return read_split(root, split, SPLIT_SIZES)


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the committed files, or with ``--check`` report whether they are up to date."""
    return data_main(argv, "examples.coding", write, stale_files)


__all__ = ["Repo", "SEED", "SPLIT_SIZES", "generate", "generate_repos", "instance", "load_instances", "main",
           "make_repo", "outcome", "plain", "prompt", "sha256", "stale_files", "write"]
