"""``mtrl check reward`` and ``mtrl check env`` on real rollouts (scripted engine, coordinator on loopback).

Each reward case plants one defect (out of range, constant, no foothold, a
lenient parser) and expects exactly the checks that name it to fail; a good
reward passes all. Each environment case plants a nondeterministic tool or
a module-level dict shared by concurrent episodes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import _eval_agents as agents
from mtrl_runtime.checks import Status, check_env, check_reward
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.evaluation import sample_seed


def config(tmp_path: Path) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "group_size": 4, "max_turns": 4,
                 "sampling_params": {"max_tokens": 64}, "val_sampling_params": {"max_tokens": 64}},
        "advanced": {"rollout_timeout_s": 30},
    })


TASKS = [{"id": f"t{i}", "prompt": f"task {i}", "ground_truth": 42} for i in range(3)]


def by_sample(replies: list[str]) -> Any:
    """A script answering sample j of every task with ``replies[j]``."""
    index = {sample_seed(0, t["id"], j): j for t in TASKS for j in range(len(replies))}
    return lambda request, prompt: replies[index[request.sampling.seed]]


def run_reward_check(tmp_path: Path, tok: Any, score: Any, replies: list[str], **kwargs: Any) -> Any:
    return check_reward(agents.make_agent(score, tools=[]), TASKS, config(tmp_path),
                        engine=ScriptedEngine(tok, by_sample(replies)), samples=len(replies), **kwargs)


def statuses(checklist: Any) -> dict[str, Status]:
    return {i.name: i.status for i in checklist.items}


MIXED = ["ANSWER 42", "ANSWER 7", "ANSWER 7", "nothing"]


def test_a_good_reward_passes_every_check(tmp_path, tiny_tok):
    checklist = run_reward_check(tmp_path, tiny_tok, agents.answer_score, MIXED, strict_scorer=agents.strict_answer)
    print(checklist)
    assert checklist.ok, str(checklist)
    assert set(statuses(checklist).values()) == {Status.PASS}
    assert "[PASS] the base model has a foothold: 3 strict successes of 12" in str(checklist)


def test_out_of_range_rewards_are_named(tmp_path, tiny_tok):
    def score(text: str, task: Any) -> float:
        return 2.0 if text == "ANSWER 42" else 0.0

    checklist = run_reward_check(tmp_path, tiny_tok, score, MIXED)
    item = checklist.item("reward stays in [0, 1]")
    assert item.status is Status.FAIL and "3 rollouts outside" in item.detail
    assert len(item.evidence["rollouts"]) == 3 and "--reward-range -1 1" in item.first_fix
    assert statuses(checklist)["reward varies across rollouts"] is Status.PASS
    # the same rewards pass once [-1, 2] is declared
    wide = run_reward_check(tmp_path, tiny_tok, score, MIXED, reward_range=(-1.0, 2.0))
    assert wide.item("reward stays in [-1, 2]").status is Status.PASS


def test_a_constant_reward_fails_both_variance_checks(tmp_path, tiny_tok):
    checklist = run_reward_check(tmp_path, tiny_tok, lambda text, task: 0.5, MIXED)
    s = statuses(checklist)
    assert s["reward varies across rollouts"] is Status.FAIL
    assert s["reward varies within groups"] is Status.FAIL
    assert checklist.item("reward varies within groups").evidence["zero_variance_frac"] == 1.0
    assert s["reward stays in [0, 1]"] is Status.PASS
    assert not checklist.ok
    assert "first fix: print one rollout's final answer" in str(checklist)


def test_zero_variance_groups_are_counted_per_group(tmp_path, tiny_tok):
    # t0 always succeeds, t1 and t2 never: rewards vary across rollouts, but no group varies within
    def replies(request: Any, prompt: str) -> str:
        return "ANSWER 42" if "task 0" in prompt else "ANSWER 7"

    checklist = check_reward(agents.make_agent(agents.answer_score, tools=[]), TASKS, config(tmp_path),
                             engine=ScriptedEngine(tiny_tok, replies), samples=4)
    s = statuses(checklist)
    assert s["reward varies across rollouts"] is Status.PASS
    assert s["reward varies within groups"] is Status.FAIL
    assert "3 of 3 groups (100%) score all alike" in checklist.item("reward varies within groups").detail


def test_no_foothold_says_to_simplify_before_training(tmp_path, tiny_tok):
    def partial(text: str, task: Any) -> float:  # credit for the format only: it varies, never succeeds
        return 0.5 if text.startswith("ANSWER") else 0.0

    checklist = run_reward_check(tmp_path, tiny_tok, partial, ["ANSWER 7", "nothing", "ANSWER 7", "nothing"],
                                 strict_scorer=agents.strict_answer)
    item = checklist.item("the base model has a foothold")
    assert item.status is Status.FAIL and item.first_fix.startswith("simplify before training")
    assert statuses(checklist)["reward varies within groups"] is Status.PASS


def test_a_lenient_parser_fails_the_strict_agreement_checks(tmp_path, tiny_tok):
    def lenient(text: str, task: Any) -> float:
        return float("42" in text and "error" not in text)

    replies = ["ANSWER 42", "answer: 42", "ANSWER 42 error", "ANSWER 7"]
    checklist = run_reward_check(tmp_path, tiny_tok, lenient, replies, strict_scorer=agents.strict_answer)
    loophole = checklist.item("reward gives no success the strict scorer denies")
    missed = checklist.item("reward agrees where the strict scorer says success")
    assert loophole.status is Status.FAIL and len(loophole.evidence["rollouts"]) == 3
    assert "'answer: 42'" in loophole.detail
    assert missed.status is Status.PASS  # "ANSWER 42 error" is not strict either
    # now a reward that misses strictly correct answers
    checklist = run_reward_check(tmp_path, tiny_tok, lambda text, task: 0.0 if text == "ANSWER 42" else 0.5,
                                 ["ANSWER 42", "ANSWER 7", "ANSWER 7", "ANSWER 7"], strict_scorer=agents.strict_answer)
    assert checklist.item("reward agrees where the strict scorer says success").status is Status.FAIL


# -- environment checks --------------------------------------------------------------------------


def env_script(first_turns: list[Any]) -> Any:
    """Turn i answers ``first_turns[i]`` (a callable of the task letter, or a reply), then ANSWER 42."""
    def reply(request: Any, prompt: str) -> Any:
        task = re.search(r"task (\w+)", prompt).group(1)
        if request.turn_index < len(first_turns):
            step = first_turns[request.turn_index]
            return step(task) if callable(step) else step
        return "ANSWER 42"
    return reply


def run_env_check(tmp_path: Path, tok: Any, tools: list[str], turns: list[Any]) -> Any:
    engine = ScriptedEngine(tok, env_script(turns), delay_s=0.1)  # both episodes write before either reads
    return check_env(agents.make_agent(agents.answer_score, tools=tools), TASKS, config(tmp_path), engine=engine)


def test_a_sound_environment_passes_and_lists_its_tools(tmp_path, tiny_tok):
    checklist = run_env_check(tmp_path, tiny_tok, ["lookup", "safe_note", "safe_recall"], [
        lambda task: ScriptedReply.tool_call("safe_note", {"text": f"from {task}"}),
        ScriptedReply.tool_call("safe_recall", {}),
        ScriptedReply.tool_call("lookup", {"key": "A1"}),
    ])
    print(checklist)
    assert checklist.ok, str(checklist)
    tools = checklist.item("tools and their schemas")
    assert tools.evidence["tools"] == ["lookup", "safe_note", "safe_recall"]
    assert '"text": {"type": "string"}' in tools.detail


def test_a_nondeterministic_tool_is_found(tmp_path, tiny_tok):
    checklist = run_env_check(tmp_path, tiny_tok, ["ticket"], [ScriptedReply.tool_call("ticket", {})])
    item = checklist.item("same task twice gives the same episode")
    assert item.status is Status.FAIL
    assert re.search(r"message 2 content: '\d+' != '\d+'", item.detail), item.detail  # the tool's result
    assert "function of its arguments" in item.first_fix
    assert checklist.item("the check episodes complete").status is Status.PASS


def test_state_shared_between_concurrent_episodes_is_found(tmp_path, tiny_tok):
    agents.LEAKY.clear()
    checklist = run_env_check(tmp_path, tiny_tok, ["note", "recall"], [
        lambda task: ScriptedReply.tool_call("note", {"text": f"from {task}"}),
        ScriptedReply.tool_call("recall", {}),
    ])
    assert checklist.item("same task twice gives the same episode").status is Status.PASS
    item = checklist.item("concurrent episodes do not see each other's state")
    assert item.status is Status.FAIL, str(checklist)
    assert "'from 0' != 'from 1'" in item.detail or "'from 1' != 'from 0'" in item.detail
    assert "per rollout" in item.first_fix


# -- the CLI --------------------------------------------------------------------------------------


def write_cli_inputs(tmp_path: Path, model_dir: Path, script: list[str]) -> tuple[Path, Path]:
    import yaml

    cfg = {"core": {"engine": "scripted", "model": str(model_dir), "run_dir": str(tmp_path / "run"),
                    "group_size": 2, "pass_k_values": [1, 2], "max_turns": 2},
           "advanced": {"engine_options": {"script": script}, "rollout_timeout_s": 30}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return tmp_path / "cfg.yaml", tmp_path / "tasks.jsonl"


def test_cli_eval_and_checks(tmp_path, tiny_model_dir, capsys):
    from mtrl_runtime.cli import main

    cfg, data = write_cli_inputs(tmp_path, tiny_model_dir, ["ANSWER 42"])
    common = [str(cfg), "--agent", "_eval_agents:agent", "--dataset", str(data)]
    assert main(["eval", *common, "--strict", "_eval_agents:strict_answer", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"val/reward/pass_k_1\s+1\.000", out) and "eval_report.md" in out
    assert (tmp_path / "run" / "eval" / "report" / "eval_report.png").is_file()

    assert main(["check", "reward", *common, "--max-tasks", "2"]) == 1  # one reply for all: constant reward
    out = capsys.readouterr().out
    assert "[FAIL] reward varies across rollouts" in out and "first fix:" in out

    assert main(["check", "env", *common, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and {i["name"] for i in report["items"]} >= {"same task twice gives the same episode"}


# -- diagnostics during training ------------------------------------------------------------------


def test_the_monitor_reports_each_finding_once_to_the_console_file_and_mlflow(tmp_path):
    from mtrl_runtime.monitor import DiagnosticsMonitor
    from mtrl_runtime.tracking import Tracker
    from mtrl_runtime.training import StepReport

    cfg = config(tmp_path)
    tracker = Tracker(cfg, run_name="monitor")
    printed: list[str] = []
    monitor = DiagnosticsMonitor.for_config(cfg, tracker=tracker, echo=printed.append)
    try:
        found = [monitor(StepReport(step, 20, {"rollout/reward/mean": 0.0, "rollout/truncated_frac": 0.0}))
                 for step in range(6)]
    finally:
        tracker.close()
    assert [len(f) for f in found] == [0, 0, 0, 0, 1, 0]  # flat for 5 steps: said once, at step 4
    assert found[4][0].rule == "reward_flat_from_start"
    assert printed == [f"mtrl diagnosis at step 4: {found[4][0]}"] and "first fix:" in printed[0]
    lines = [json.loads(x) for x in (tmp_path / "run" / "diagnostics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["rule"]) for x in lines] == [(4, "reward_flat_from_start")]
    run = tracker.client.get_run(tracker.run_id)
    assert run.data.metrics["diagnostics/reward_flat_from_start"] == 1.0
    assert "first fix: check the agent's output format" in run.data.tags["mtrl.diagnosis.reward_flat_from_start"]
    # a finding that goes away and comes back is reported again
    monitor.tracker = None
    assert monitor.observe(6, {"rollout/reward/mean": 0.5}) == []
    assert [d.rule for d in monitor.observe(7, {"rollout/truncated_frac": 0.5})] == ["token_cap"]
