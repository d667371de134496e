"""The per-turn judge: its prompt and reply, and the audit's checks on hand-built judgments (a fit judge, a biased one).

The whole audit through ``mtrl check reward --judge`` (a scripted judge
behind ``mtrl serve --inference``, the aircraft agent's rollouts, the strict
per-turn scorer) runs in the docs test of docs/group_judge.md.
"""

from __future__ import annotations

import pytest

from mtrl_runtime.checks._turn_judge import JudgedTurns, turn_judge_checklist
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.rewards import JudgeReplyError, JudgeSpec, TurnView, turn_judge_messages, turns_of
from mtrl_runtime.rewards._turn_judge import _parse
from mtrl_runtime.types import Rollout, RolloutStatus, Task, Turn

SPEC = JudgeSpec(base_url="http://127.0.0.1:9/v1", model="j", per_turn=True, rubric="Right steps score 1.")
TASK = Task(id="t", prompt="Inspect N1")


def _rollout(rid: str, n: int, labels: list[float] | None = None, lengths: list[int] | None = None) -> Rollout:
    lengths = lengths or [4] * n
    turns = tuple(Turn(rollout_id=rid, index=i, messages=(), prompt_ids=(1,), completion_ids=tuple(range(lengths[i])),
                       logprobs=(-1.0,) * lengths[i], finish_reason="stop", completion_text=f"step {i} of {rid}",
                       tool_calls=({"id": f"c{i}", "type": "function",
                                    "function": {"name": f"tool{i}", "arguments": "{}"}},) if i < n - 1 else ())
                  for i in range(n))
    return Rollout(id=rid, task_id="t", group_id="g", status=RolloutStatus.COMPLETED, turns=turns,
                   turn_rewards=tuple(labels) if labels else None)


def test_the_prompt_shows_each_turn_by_position_and_the_reply_gives_one_score_per_turn():
    rollout = _rollout("r1", 3)
    views = turns_of(rollout)
    [message] = turn_judge_messages(SPEC, rollout, TASK, [views[2], views[0], views[1]])
    text = message["content"]
    assert text.index('<turn id="s1">\nstep 2 of r1') < text.index('<turn id="s2">\nstep 0 of r1')
    assert "[calls] tool0({})" in text and "Right steps score 1." in text and "Inspect N1" in text
    scores, _ = _parse('{"scores": [{"id": "s1", "score": 1}, {"id": "s2", "score": 0.5}, {"id": "s3", "score": 0}]}',
                       views)
    assert scores == (1.0, 0.5, 0.0)
    with pytest.raises(JudgeReplyError, match="r1 turn 2"):  # a turn without a score names it
        _parse('{"scores": [{"id": "s1", "score": 1}, {"id": "s2", "score": 1}]}', views)


def _judged(rollout: Rollout, orders: list[list[int]], score) -> JudgedTurns:
    """``score(turn view, position shown)`` for every order of the rollout's turns."""
    views = turns_of(rollout)
    scores, positions = [], []
    for order in orders:
        shown = [views[i] for i in order]
        scores.append({v.index: score(v, p) for p, v in enumerate(shown)})
        positions.append({v.index: p for p, v in enumerate(shown)})
    return JudgedTurns(rollout, views, tuple(scores), tuple(positions))


ORDERS = [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]]
LABELS = {"a": [1.0, 0.0, 1.0, 1.0], "b": [0.0, 1.0, 1.0, 0.0], "c": [1.0, 1.0, 0.0, 1.0]}


def _status(checklist) -> dict[str, str]:
    return {item.name: item.status.value for item in checklist.items}


def test_a_judge_that_reads_the_turns_passes_every_check():
    judged = [_judged(_rollout(rid, 4, labels, [3, 9, 5, 7]), ORDERS,
                      lambda v, p, labels=labels: 0.9 if labels[v.index] > 0 else 0.1)
              for rid, labels in LABELS.items()]
    status = _status(turn_judge_checklist(judged, {"t": TASK}))
    assert set(status.values()) == {"pass"}, status


def test_a_judge_that_scores_by_position_or_by_place_is_refused():
    by_position = [_judged(_rollout(rid, 4, labels), ORDERS, lambda v, p: 1.0 if p == 0 else 0.0)
                   for rid, labels in LABELS.items()]
    status = _status(turn_judge_checklist(by_position, {"t": TASK}))
    assert status["no position bias (turn score vs position shown)"] == "fail"
    assert status["judge agrees with the labelled turns"] == "fail"
    assert status["the per-turn judge is fit to train on"] == "fail"
    late = [_judged(_rollout(rid, 4, [1.0] * 4), ORDERS, lambda v, p: 0.25 * v.index) for rid in "abc"]
    status = _status(turn_judge_checklist(late, {"t": TASK}))
    assert status["no turn-order bias (score vs place in the rollout)"] == "fail"
    assert status["no position bias (turn score vs position shown)"] == "pass"


def test_a_strict_turn_scorer_labels_the_turns_and_must_give_one_score_per_turn():
    judged = [_judged(_rollout("a", 4), ORDERS, lambda v, p: 0.9)]
    status = _status(turn_judge_checklist(judged, {"t": TASK}, strict_turns=lambda r, t: [1.0] * 4))
    assert status["judge agrees with the labelled turns"] == "pass"
    with pytest.raises(ValueError, match="3 scores for rollout 'a', which has 4 assistant turns"):
        turn_judge_checklist(judged, {"t": TASK}, strict_turns=lambda r, t: [1.0] * 3)
    unlabelled = _status(turn_judge_checklist(judged, {"t": TASK}))
    assert unlabelled["judge agrees with the labelled turns"] == "skip"


def test_per_turn_is_checked_at_load_and_cannot_train_yet():
    with pytest.raises(ConfigError, match=r"group_judge.per_turn"):
        MtrlConfig.from_dict({"advanced": {"group_judge": {"base_url": "http://j:1/v1", "model": "j",
                                                           "per_turn": True}}})
    with pytest.raises(ConfigError, match=r"per_turn.*'often'"):
        MtrlConfig.from_dict({"advanced": {"group_judge": {"base_url": "http://j:1/v1", "model": "j",
                                                           "per_turn": "often"}}})


def test_per_turn_judge_config_needs_group_based_per_turn():
    judge = {"base_url": "http://j:1/v1", "model": "j", "per_turn": True}
    with pytest.raises(ConfigError, match=r"advanced.group_judge.per_turn: true .* 'group_based'"):
        MtrlConfig.from_dict({"advanced": {"group_judge": judge}})
    ok = MtrlConfig.from_dict({"core": {"advantage_method": "group_based_per_turn"}, "advanced": {"group_judge": judge}})
    assert ok.advanced.group_judge.per_turn


TRAIN = [{"id": f"train-{n}", "prompt": f"question {n}", "ground_truth": 42} for n in "ab"]
TURN_SCORES = {"ANSWER 42": 0.9, "ANSWER 7": 0.2}


@pytest.mark.timeout(300)
def test_training_stores_the_per_turn_judges_scores_as_turn_rewards(tmp_path, tiny_tok, tiny_model_dir, served):
    """group_based_per_turn on a per-turn judge: each turn's score is its stored reward; a tripwire's zero stands."""
    import json
    import re

    import torch

    import _eval_agents as agents
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    prompts: list[str] = []

    def judge(request, prompt: str) -> str:
        prompts.append(prompt)
        found = re.findall(r'<turn id="(s\d+)">\n(.*?)\n</turn>', prompt, re.DOTALL)
        return json.dumps({"scores": [{"id": label, "score": TURN_SCORES[text.strip()]} for label, text in found]})

    url = served(ScriptedEngine(tiny_tok, judge), MtrlConfig.from_dict(
        {"advanced": {"server": {"inference_mode": True}}})).url + "/v1"
    count: dict[str, int] = {}

    def policy(request, prompt: str) -> str:
        task = next(t["id"] for t in TRAIN if t["prompt"] in prompt)
        count[task] = count.get(task, 0) + 1
        return "ANSWER 42" if count[task] % 2 else "ANSWER 7"

    config = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "model": str(tiny_model_dir), "group_size": 2,
                 "train_batch_size": 2, "max_steps": 1, "val_every": 0, "max_turns": 2, "lora_rank": 4,
                 "lora_alpha": 8, "sampling_params": {"max_tokens": 16}, "advantage_method": "group_based_per_turn"},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 30,
                     "group_judge": {"base_url": url, "model": "turn-judge", "per_turn": True}},
    })
    result = MultiTurnRLTrainer(agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TRAIN,
                                config=config, engine=ScriptedEngine(tiny_tok, policy), tracking=False
                                ).train(progress=False)
    assert result.final_step == 1 and len(prompts) == 4  # one request per rollout: 2 tasks x 2 rollouts
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        for r in [r for r in store.rollouts() if r.step is not None]:
            answer = r.turns[-1].completion_text
            assert r.turn_rewards == (TURN_SCORES[answer],) and r.reward is None  # the judge's score, per turn
            assert r.metrics["agent_reward"] == float(answer == "ANSWER 42") and r.metrics["judged"] == 1.0
            assert [c.model for c in r.model_calls] == ["turn-judge"]
    finally:
        store.close()
