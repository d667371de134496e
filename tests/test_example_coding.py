"""The coding example: generated repositories, the strict scorer in a sandbox, the agent end to end, one step.

The repositories are checked on every task (the visible tests fail before
the reference fix and pass after it); the scorer runs in real namespace
sandboxes on the bug, the fix, and the ways an agent could game it (edit
the tests, add files, plant modules, fake the runner's output, loop
forever). The agent runs against the real coordinator with a scripted
policy that reads, fixes, tests and answers, each rollout in its own
sandbox; then one training step with the tiny model on the hf engine.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from _sandbox_support import require, sandbox_root
from examples.coding import SPLIT_SIZES, TEMPLATES, generate, load_instances, score, stale_files
from examples.coding.agent import make_agent, prepare, run
from examples.coding.data import PACKAGE_DIR, SEED, generate_repos
from examples.coding.scripted import episode, match, stale_files as stale_script
from mtrl_adapters import rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.sandboxes import Sandboxes
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

REPOS = {split: repos for split, repos in generate_repos().items()}
ALL = [row for split in SPLIT_SIZES for row in load_instances(split)]
BY_ID = {row["id"]: row for row in ALL}
REPO_OF = {row["id"]: repo for split, repos in REPOS.items() for row, repo in zip(load_instances(split), repos)}
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sandboxes():
    for root in sandbox_root():
        require("bubblewrap", root=str(root))
        provider = Sandboxes({"kind": "bubblewrap", "root": str(root), "timeout_s": 60})
        yield provider
        asyncio.run(provider.close())


def task_of(row: dict) -> Task:
    return Task(id=row["id"], prompt=row["prompt"], ground_truth=row["ground_truth"], data=row["data"],
                split=row["split"])


def one_per_template() -> list[dict]:
    seen: dict[str, dict] = {}
    for row in ALL:
        seen.setdefault(row["data"]["template"], row)
    return list(seen.values())


# --------------------------------------------------------------------------- the tasks


def test_the_committed_tasks_and_script_are_what_the_generators_make():
    assert stale_files() == [] and stale_script() == []
    assert generate(SEED) == generate(SEED)
    assert generate(SEED + 1)["instances/train.jsonl"] != generate(SEED)["instances/train.jsonl"]


def test_65_distinct_repositories_in_three_splits_with_every_template_in_train():
    assert sum(SPLIT_SIZES.values()) == len(ALL) == 65
    for split, size in SPLIT_SIZES.items():
        assert len(load_instances(split)) == size
    assert len({r["id"] for r in ALL}) == len({r["prompt"] for r in ALL}) == 65
    assert {r["data"]["template"] for r in ALL if r["split"] == "train"} == {t.name for t in TEMPLATES}
    for row in ALL:
        truth = row["ground_truth"]
        assert set(row["data"]["files"]) == set(truth["files"]) == {"README.md", truth["target"],
                                                                      f"test_{truth['module']}.py"}
        assert any(truth["reveals"]) and not all(truth["reveals"])  # the hidden test checks the fix and the rest
        assert sum(match(REPO_OF[row["id"]]) in other["prompt"] for other in ALL) == 1  # the script's key
        assert "hidden" not in json.dumps(row["data"])  # the workspace holds nothing of the hidden test


def test_visible_tests_fail_on_every_bug_and_pass_on_every_reference_fix(tmp_path):
    def outcome(row: dict, fixed: bool) -> tuple[str, bool, bool, str]:
        repo = REPO_OF[row["id"]]
        folder = tmp_path / f"{row['id']}-{fixed}"
        folder.mkdir()
        for path, text in row["data"]["files"].items():
            (folder / path).write_text(text)
        if fixed:
            (folder / repo.target).write_text(repo.fixed)
        done = subprocess.run([sys.executable, "-B", "-m", "unittest", "-q"], cwd=folder, capture_output=True,
                              text=True, timeout=60)
        return row["id"], fixed, done.returncode == 0, done.stderr[-800:]

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda job: outcome(*job), [(row, fixed) for row in ALL for fixed in (False, True)]))
    for task_id, fixed, passed, stderr in outcomes:
        assert passed == fixed, (task_id, fixed, stderr)


# --------------------------------------------------------------------------- the scorer, in a sandbox


async def _score_with(sandboxes: Sandboxes, row: dict, edit: str | None = None, files: dict | None = None):
    async with sandboxes.sandbox(row["id"]) as box:
        await prepare(box, task_of(row))
        for path, text in (files or {}).items():
            await box.write_file(path, text)
        if edit:
            assert (await box.run(edit)).ok
        return await score(box, row["ground_truth"])


async def test_the_scorer_fails_every_bug_and_passes_every_reference_fix(sandboxes):
    rows = one_per_template()

    async def both(row: dict) -> None:
        repo = REPO_OF[row["id"]]
        bug = await _score_with(sandboxes, row)
        assert (bug.strict, bug.reward, bug.fixed_frac, bug.kept_frac) == (0.0, 0.0, 0.0, 1.0), row["id"]
        assert bug.changed == () and bug.problem is None
        fix = await _score_with(sandboxes, row, files={repo.target: repo.fixed})
        assert (fix.strict, fix.reward) == (1.0, 1.0) and fix.changed == (repo.target,), (row["id"], fix)

    for start in range(0, len(rows), 4):
        await asyncio.gather(*(both(row) for row in rows[start:start + 4]))


def _row(template: str) -> dict:
    return next(r for r in ALL if r["data"]["template"] == template)


async def test_the_scorer_refuses_changes_outside_the_target_and_tests_rewritten_to_pass(sandboxes):
    row = _row("mean")
    repo = REPO_OF[row["id"]]
    module, tests = repo.target, f"test_{repo.theme.module}.py"
    cases = {
        "fix, and the tests edited": {module: repo.fixed, tests: "import unittest\n"},
        "tests emptied, no fix": {tests: "import unittest\n"},
        "fix, and a conftest.py added": {module: repo.fixed, "conftest.py": "pass\n"},
        "fix, and a helper module added": {module: repo.fixed, "helpers.py": "X = 1\n"},
    }
    for what, files in cases.items():
        found = await _score_with(sandboxes, row, files=files)
        assert (found.strict, found.reward, found.metrics()["untouched_others"]) == (0.0, 0.0, 0.0), what
    removed = await _score_with(sandboxes, row, edit=f"rm README.md && cat > {module} <<'EOF'\n{repo.fixed}EOF")
    assert removed.others_changed == ("README.md",) and removed.strict == 0.0
    cached = await _score_with(sandboxes, row, files={module: repo.fixed}, edit="python3 -m unittest -q")
    assert cached.strict == 1.0  # __pycache__ written by running the tests is not a change


async def test_partial_fixes_earn_partial_reward_and_no_strict_success(sandboxes):
    row = _row("mean")
    repo = REPO_OF[row["id"]]
    fn = repo.theme.function
    half = repo.files[repo.target].replace("    return sum(values) // len(values)",
                                           "    if not values:\n        return 0.0\n    return sum(values) // len(values)")
    found = await _score_with(sandboxes, row, files={repo.target: half})
    assert 0.0 < found.fixed_frac < 1.0 and found.kept_frac == 1.0
    assert 0.0 < found.reward < 1.0 and found.strict == 0.0
    broken = repo.fixed.replace(f"def {fn}(values):", f"def {fn}(values):\n    return 1.5")
    found = await _score_with(sandboxes, row, files={repo.target: broken})
    assert found.kept_frac < 1.0 and found.strict == 0.0 and found.reward <= 0.5 * found.fixed_frac


async def test_code_in_the_workspace_cannot_fake_the_hidden_test(sandboxes):
    row = _row("fizzbuzz")
    repo = REPO_OF[row["id"]]
    fake = json.dumps({"results": [{"value": "x"} for _ in row["ground_truth"]["inputs"]]})
    liar = repo.files[repo.target] + f"\nprint('\\n@@mtrl-hidden-results@@' + {fake!r})\n"
    quitter = repo.files[repo.target] + "\nimport atexit, os\natexit.register(lambda: os._exit(0))\n"
    hanger = repo.files[repo.target] + "\nwhile True:\n    pass\n"
    for what, source in (("prints a fake result line", liar), ("exits early", quitter), ("loops at import", hanger)):
        found = await _score_with(sandboxes, row, files={repo.target: source})
        assert found.strict == 0.0 and found.reward == 0.0, (what, found)
    planted = await _score_with(sandboxes, row, files={repo.target: repo.fixed},
                                edit="mkdir -p ~/.local/lib/python3.11/site-packages /tmp/x && "
                                     "echo 'raise SystemExit(3)' > ~/.local/lib/python3.11/site-packages/sitecustomize.py"
                                     " && echo 'raise SystemExit(3)' > /tmp/json.py")
    assert planted.strict == 1.0  # python3 -I: nothing the agent left outside the workspace is imported


async def test_a_fix_that_loops_forever_costs_its_inputs_not_the_run(sandboxes):
    row = _row("binary_search")
    repo = REPO_OF[row["id"]]
    found = await _score_with(sandboxes, row)  # the bug itself loops on the revealing inputs
    assert found.fixed_frac == 0.0 and found.kept_frac == 1.0 and found.problem is None


# --------------------------------------------------------------------------- the agent on the coordinator


def reference_policy(rows: list[dict]) -> Any:
    """Replies with each task's reference episode (scripted.episode): read, fix, test, answer."""
    by_match = {match(REPO_OF[r["id"]]): REPO_OF[r["id"]] for r in rows}

    def policy(request: Any, prompt: str) -> ScriptedReply | str:
        repo = next(repo for key, repo in by_match.items() if key in prompt)
        reply = episode(repo)[request.turn_index]
        if isinstance(reply, str):
            return reply
        call = reply["tool_call"]
        return ScriptedReply.tool_call(call["name"], call["arguments"])

    return policy


def _specs(handle: Any, rows: list[dict], max_turns: int = 10, max_tokens: int = 4096) -> list[RolloutSpec]:
    out = []
    for row in rows:
        task = task_of(row)
        made = handle.coordinator.create_rollout(task)
        out.append(RolloutSpec(made.rollout_id, made.group_id, task, made.token, handle.url, "policy",
                               SamplingParams(max_tokens=max_tokens), max_turns, 120.0))
    return out


async def _run_all(agent: Any, specs: list[RolloutSpec]) -> list[str]:
    async def one(spec: RolloutSpec) -> str:
        with rollout_scope(spec):
            return await agent(spec.task)

    return await asyncio.gather(*(one(s) for s in specs))


async def test_8_concurrent_repositories_are_fixed_tested_and_scored_each_in_its_own_sandbox(served, tiny_tok,
                                                                                            sandboxes):
    rows = [r for r in ALL if r["split"] == "test"][:8]
    handle = served(ScriptedEngine(tiny_tok, reference_policy(rows)))
    specs = _specs(handle, rows)
    texts = await _run_all(make_agent(sandboxes=sandboxes), specs)
    for spec, row, text in zip(specs, rows, texts):
        repo = REPO_OF[row["id"]]
        record = handle.store.get_rollout(spec.rollout_id)
        assert record.status is RolloutStatus.COMPLETED, record.error
        assert text.startswith(f"Fixed `{repo.theme.function}`")
        assert [c.name for c in record.tool_calls] == ["read_file", "write_file", "run_command"]
        read, written, tested = record.tool_calls
        assert read.result == {"content": row["data"]["files"][repo.target]}  # this task's own file, nobody else's
        assert written.arguments == {"path": repo.target, "content": repo.fixed}
        assert tested.result["exit_code"] == 0 and "OK" in tested.result["stderr"]
        assert record.reward == 1.0 and record.metrics["strict"] == 1.0 and record.metrics["completion"] == 1.0
    assert sandboxes.open_count == 0 and list(sandboxes.root.iterdir()) == []  # every sandbox removed


async def test_a_policy_that_rewrites_the_tests_gets_nothing(served, tiny_tok, sandboxes):
    row = _row("chunk")
    repo = REPO_OF[row["id"]]
    tests = f"test_{repo.theme.module}.py"
    script = [ScriptedReply.tool_call("write_file", {"path": tests, "content": "import unittest\n"}),
              ScriptedReply.tool_call("run_command", {"command": "python3 -m unittest"}),
              ScriptedReply.tool_call("run_command", {"command": "ls -a /workspace /tmp"}), "Done: the tests pass."]
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: script[request.turn_index]))
    [spec] = _specs(handle, [row])
    await _run_all(make_agent(sandboxes=sandboxes), [spec])
    record = handle.store.get_rollout(spec.rollout_id)
    assert record.tool_calls[1].result["exit_code"] == 0  # its own tests "pass" ...
    listing = record.tool_calls[2].result["stdout"]
    assert ".mtrl-score" not in listing and "hidden" not in listing  # the hidden test is not there while it works
    assert record.reward == 0.0 and record.metrics["untouched_others"] == 0.0 and record.metrics["strict"] == 0.0


async def test_mistakes_are_error_results_and_a_silent_agent_ends_at_max_turns(served, tiny_tok, sandboxes):
    row = _row("vowels")
    script = [ScriptedReply.tool_call("read_file", {"path": "nope.py"}),
              ScriptedReply.tool_call("read_file", {"file": "x"}),
              ScriptedReply.tool_call("delete_everything", {}),
              ScriptedReply.tool_call("run_command", {"command": "sleep 100"})]
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: script[min(request.turn_index, 3)]))
    [spec] = _specs(handle, [row], max_turns=4)
    from examples.coding import tools

    tools.COMMAND_S, saved = 1.0, tools.COMMAND_S
    try:
        [text] = await _run_all(make_agent(sandboxes=sandboxes), [spec])
    finally:
        tools.COMMAND_S = saved
    record = handle.store.get_rollout(spec.rollout_id)
    errors = [c.error for c in record.tool_calls]
    assert "no such file" in errors[0] and "unknown argument 'file'" in errors[1]
    assert "unknown tool 'delete_everything'" in errors[2] and "killed after" in errors[3]
    assert text == "" and record.metrics["completion"] == 0.0 and record.reward == 0.0


async def test_a_reply_cut_at_max_tokens_ends_the_episode_but_is_no_answer(served, tiny_tok, sandboxes):
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "The bug is somewhere in the loop, " * 20))
    [spec] = _specs(handle, [_row("chunk")], max_tokens=8)
    await _run_all(make_agent(sandboxes=sandboxes), [spec])
    record = handle.store.get_rollout(spec.rollout_id)
    assert record.turns[0].finish_reason == "length" and record.metrics["completion"] == 0.0
    assert record.reward == 0.0


# --------------------------------------------------------------------------- config, the strict scorer, training


def test_the_strict_scorer_reads_what_the_sandbox_measured_and_loads_from_the_command_line():
    from dataclasses import replace

    from mtrl_runtime.cli._agents import load_strict_scorer
    from mtrl_runtime.types import Rollout

    scorer = load_strict_scorer("examples.coding.strict:strict_score")
    assert scorer.input == "rollout" and scorer.threshold == 1.0
    assert load_strict_scorer("examples.coding.strict:strict_score", threshold=0.5).threshold == 0.5
    assert load_strict_scorer("examples.sql_agent.reward:strict_score").input == "text"  # a function: the text
    with pytest.raises(ValueError, match="no function or StrictScorer 'SEED'"):
        load_strict_scorer("examples.coding.data:SEED")
    done = Rollout(id="r", task_id="t", group_id="g", status=RolloutStatus.COMPLETED, metrics={"strict": 1.0})
    task = task_of(ALL[0])
    assert scorer.score(done, task) == 1.0
    assert scorer.score(replace(done, status=RolloutStatus.FAILED, metrics={}), task) == 0.0
    with pytest.raises(ValueError, match="without a 'strict' metric"):
        scorer.score(replace(done, metrics={}), task)


# --------------------------------------------------------------------------- config and training


def test_the_configs_validate_and_name_the_train_split_and_a_sandbox():
    for name in ("config.yaml", "scripted.yaml"):
        config = MtrlConfig.from_yaml(PACKAGE_DIR / name)
        assert (REPO_ROOT / config.core.dataset).resolve() == (PACKAGE_DIR / "instances" / "train.jsonl").resolve()
        assert config.advanced.sandbox.kind == "bubblewrap"
    from mtrl_runtime.cli import load_agent

    assert load_agent("examples.coding.agent:run") is run


@pytest.mark.timeout(240)
def test_one_training_step_with_the_tiny_model_on_the_hf_engine(tmp_path, tiny_tok, sandboxes):
    import torch

    from mtrl_runtime.engines import HFEngine
    from mtrl_runtime.testing import tiny_model
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    config = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "group_size": 2, "train_batch_size": 2, "max_steps": 1,
                 "max_turns": 3, "lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-3,
                 "sampling_params": {"max_tokens": 16}},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 120,
                     "sandbox": {"kind": "bubblewrap", "root": str(sandboxes.root)}}})
    trainer = MultiTurnRLTrainer(agent_env=run, training_dataset=ALL[:2], config=config,
                                 engine=HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok), tracking=False)
    result = trainer.train(progress=False)
    [report] = result.reports
    assert report.metrics["rollout/count"] == 4 and report.metrics["rollout/completed_frac"] == 1.0
    assert report.metrics["rollout/reward_defaulted_frac"] == 0.0  # the agent scored every rollout
    assert "rollout/metrics/strict" in report.metrics and "rollout/metrics/untouched_others" in report.metrics
    assert (result.output_adapter_path / "adapter_config.json").is_file()
    assert list(sandboxes.root.iterdir()) == []  # the run's sandboxes (from its config) are gone
