"""``mtrl check budget``: max_turns and the reply cap recommended from rollouts, the worst case against the context.

The rules on recorded rollouts built here (exact figures), then real
rollouts of a tool-calling agent on the scripted engine through the
coordinator on loopback, read back from the check's store by ``--store``,
and the warning ``mtrl train`` gives at start when the config's turns
cannot fit the model's context.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

import _eval_agents as agents
from mtrl_runtime.checks import BudgetReport, check_budget, context_budget_warning, recommend
from mtrl_runtime.cli import main
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.types import BreakReason, Rollout, RolloutStatus, Turn


def _rollout(i: int, replies: list[int], reward: float, *, prompt: int = 100, tool: int = 20, cut: int = 0,
             limited: bool = False) -> Rollout:
    """A rollout whose turns have ``replies`` completion lengths (the last ``cut`` of them cut at the cap),
    a first prompt of ``prompt`` ids and ``tool`` ids of new messages between turns."""
    turns, length = [], prompt
    for j, n in enumerate(replies):
        turns.append(Turn(rollout_id=f"r{i}", index=j, messages=(), prompt_ids=tuple(range(length)),
                          completion_ids=tuple(range(n)), logprobs=(0.0,) * n,
                          finish_reason="length" if j >= len(replies) - cut else "stop", completion_text=""))
        length += n + tool
    return Rollout(id=f"r{i}", task_id=f"t{i}", group_id="g", status=RolloutStatus.COMPLETED, turns=tuple(turns),
                   reward=reward, metrics={"hit_turn_limit": 1.0} if limited else {})


def test_max_turns_is_one_and_a_half_times_what_the_successful_rollouts_needed():
    rollouts = [_rollout(0, [10, 10, 10], 1.0), _rollout(1, [10] * 5, 1.0), _rollout(2, [10] * 8, 0.0, limited=True)]
    report = recommend(rollouts, max_turns=8, max_tokens=64, context_length=None)
    f = report.figures
    assert (f.rollouts, f.successful, f.turns, f.max_turns_successful, f.turn_limited) == (3, 2, 16, 5, 1)
    assert report.recommended_max_turns == 8  # ceil(1.5 x 5); the failed 8-turn rollout does not count
    assert f.prompt_tokens == 100 and f.tool_output_tokens == 20 and f.longest_reply == 10
    assert recommend(rollouts[:1], max_turns=8, max_tokens=64, context_length=None).recommended_max_turns == 5


def test_the_cap_is_the_smallest_step_that_under_five_percent_of_replies_reach():
    # 100 replies of 1..100 tokens: 96 is reached by 5 (5%, not under), 128 by none
    rollouts = [_rollout(i, [n], 1.0) for i, n in enumerate(range(1, 101))]
    assert recommend(rollouts, max_turns=4, max_tokens=4096, context_length=None).recommended_max_tokens == 128
    # one long reply in 40 (2.5%) may reach the cap: the cap follows the rest
    rollouts = [_rollout(i, [30], 1.0) for i in range(39)] + [_rollout(39, [900], 1.0)]
    assert recommend(rollouts, max_turns=4, max_tokens=4096, context_length=None).recommended_max_tokens == 32
    # two in 40 (5%) may not both reach it: the cap covers the shorter (704 > 700), the longest alone reaches it
    rollouts[38] = _rollout(38, [700], 1.0)
    assert recommend(rollouts, max_turns=4, max_tokens=4096, context_length=None).recommended_max_tokens == 704


def test_replies_cut_at_the_cap_double_it_and_say_their_length_is_not_known():
    rollouts = [_rollout(i, [64, 64], 1.0, cut=1) for i in range(4)]  # half the replies hit the cap of 64
    report = recommend(rollouts, max_turns=4, max_tokens=64, context_length=None)
    assert report.figures.replies_at_cap == 4 and report.recommended_max_tokens == 128
    assert any("4 of 8 replies hit the cap of 64" in n for n in report.notes)


def test_no_success_keeps_max_turns_and_names_the_first_fix():
    report = recommend([_rollout(0, [10, 10], 0.0)], max_turns=6, max_tokens=64, context_length=None)
    assert report.recommended_max_turns == 6 and "mtrl check reward" in report.notes[0]
    assert "no successful rollout" in str(report)


def test_the_worst_case_is_prompt_plus_turns_at_the_cap_plus_tool_output_against_the_context():
    rollouts = [_rollout(0, [40, 40], 1.0, prompt=500, tool=100)]
    report = recommend(rollouts, max_turns=10, max_tokens=256, context_length=2048)
    assert report.current_worst_case == 500 + 10 * 256 + 9 * 100 and not report.fits
    assert (report.recommended_max_turns, report.recommended_max_tokens) == (3, 64)
    assert report.recommended_worst_case == 500 + 3 * 64 + 2 * 100 and report.recommended_fits
    text = str(report)
    assert "fits the context" in text and "NO" in text and "yes" in text
    assert text.endswith("core:\n  max_turns: 3\n  sampling_params:\n    max_tokens: 64")
    assert yaml.safe_load(report.yaml()) == {"core": {"max_turns": 3, "sampling_params": {"max_tokens": 64}}}
    tight = recommend(rollouts, max_turns=10, max_tokens=256, context_length=700)
    assert not tight.recommended_fits and any("even the recommended budget" in n for n in tight.notes)


def test_a_broken_segment_does_not_count_as_tool_output():
    rollout = _rollout(0, [10, 10, 10], 1.0, tool=20)
    far = Turn(**{**rollout.turns[2].__dict__, "prompt_ids": tuple(range(5000)), "break_reason": BreakReason.HISTORY_REWRITTEN})
    rollout = Rollout(**{**rollout.__dict__, "turns": (*rollout.turns[:2], far)})
    assert recommend([rollout], max_turns=4, max_tokens=64, context_length=None).figures.tool_output_tokens == 20


def test_bad_input_is_an_error_naming_it():
    with pytest.raises(ValueError, match="rollouts with recorded turns"):
        recommend([], max_turns=4, max_tokens=64, context_length=None)
    with pytest.raises(ValueError, match="max_turns and max_tokens must be >= 1, got 0 and 64"):
        recommend([_rollout(0, [1], 1.0)], max_turns=0, max_tokens=64, context_length=None)


# ---------------------------------------------------------------------------------------------- real rollouts
TASKS = [{"id": f"t{i}", "prompt": f"task {i}", "ground_truth": 42} for i in range(4)]


def _script(request, prompt):
    """Tasks t0, t1: look up A1, add 0, answer (3 turns, success); t2, t3: ramble until the turn limit."""
    task = next(t["id"] for t in TASKS if t["prompt"] in prompt)
    if task in ("t0", "t1"):
        return [ScriptedReply.tool_call("lookup", {"key": "A1"}), ScriptedReply.tool_call("add", {"a": 42, "b": 0}),
                "ANSWER 42"][request.turn_index]
    return ScriptedReply.tool_call("lookup", {"key": "B2"})


def _config(tmp_path: Path) -> dict:
    return {"core": {"run_dir": str(tmp_path / "run"), "group_size": 1, "max_turns": 5,
                     "sampling_params": {"max_tokens": 64}},
            "advanced": {"rollout_timeout_s": 30}}


def test_rollouts_of_a_tool_agent_then_the_same_store_through_the_command(tmp_path, tiny_tok, capsys):
    config = MtrlConfig.from_dict(_config(tmp_path))
    report = check_budget(agents.make_agent(agents.answer_score), TASKS, config,
                          engine=ScriptedEngine(tiny_tok, _script, context_length=1024), samples=1,
                          output_path=tmp_path / "check")
    assert isinstance(report, BudgetReport)
    f = report.figures
    assert (f.rollouts, f.successful, f.max_turns_successful, f.turn_limited) == (4, 2, 3, 2)
    assert f.turns == 2 * 3 + 2 * 5 and f.replies_at_cap == 0
    assert report.recommended_max_turns == 5  # ceil(1.5 x 3)
    assert report.recommended_max_tokens == 32 * -(-(f.longest_reply + 1) // 32)
    assert report.context_length == 1024 and report.context_source == "the engine"
    assert report.fits == (report.current_worst_case <= 1024)

    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(_config(tmp_path)))
    store = str(tmp_path / "check" / "check_budget.db")
    status = main(["check", "budget", str(config_file), "--store", store, "--context-length", "1024", "--json"])
    read = json.loads(capsys.readouterr().out)
    assert read["figures"] == report.to_dict()["figures"] and read["recommended"] == report.to_dict()["recommended"]
    assert status == (0 if report.fits else 1)
    status = main(["check", "budget", str(config_file), "--store", store, "--context-length", "256"])
    text = capsys.readouterr().out
    assert status == 1 and "fits the context" in text and "NO" in text and "paste into the config:" in text
    with pytest.raises(SystemExit, match="--agent and --dataset"):
        main(["check", "budget", str(config_file)])
    with pytest.raises(FileNotFoundError, match="no trajectory store"):
        main(["check", "budget", str(config_file), "--store", str(tmp_path / "missing.db")])


# ---------------------------------------------------------------------------------------------- mtrl train
def test_the_warning_names_both_settings_and_the_context():
    assert context_budget_warning(8, 256, 4096) is None and context_budget_warning(8, 4096, None) is None
    warning = context_budget_warning(8, 4096, 8192)
    assert "core.max_turns 8 x sampling_params.max_tokens 4096 = 32768" in warning and "8192" in warning
    assert "mtrl check budget" in warning


def test_training_warns_at_start_when_the_turns_cannot_fit_the_context(tmp_path, tiny_model_dir, tiny_tok, caplog):
    from mtrl_runtime.training import MultiTurnRLTrainer

    config = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "model": str(tiny_model_dir), "group_size": 1, "train_batch_size": 1,
                 "max_steps": 0, "max_turns": 6, "lora_rank": 4, "lora_alpha": 8, "sampling_params": {"max_tokens": 96}},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 30},
    })
    trainer = MultiTurnRLTrainer(agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TASKS,
                                 config=config, engine=ScriptedEngine(tiny_tok, ["ANSWER 42"], context_length=512),
                                 tracking=False)
    with caplog.at_level(logging.WARNING, logger="mtrl.train"):
        trainer.train(progress=False)
    [record] = [r for r in caplog.records if "mtrl check budget" in r.getMessage()]
    assert "core.max_turns 6 x sampling_params.max_tokens 96 = 576" in record.getMessage()
    assert "context of 512 tokens" in record.getMessage()
