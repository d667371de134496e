"""The audited group judge: a judge model served by the scripted engine on a real loopback endpoint.

The judge is a second coordinator in inference mode (``mtrl serve --inference``
style) whose scripted engine reads the rendered judge prompt (the group's
``<trajectory id="tK">`` blocks and their final answers) and answers JSON
scores. The agents are the OpenAI-client agents of ``_eval_agents`` on the
policy's own coordinator. Planted defects: a judge that always ranks the
first trajectory highest (position bias), one that pays for length, one
that answers prose or skips an id; a faithful judge passes the audit, and
training with it stores its scores as the rewards.
"""

from __future__ import annotations

import json
import re
import ssl
from pathlib import Path
from typing import Any, Callable

import pytest

import _eval_agents as agents
from mtrl_runtime.checks import Status, check_reward
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.evaluation import sample_seed
from mtrl_runtime.rewards import (
    GroupJudge,
    JudgeError,
    JudgeReplyError,
    JudgeSpec,
    JudgeSpecError,
    refuse_policy_endpoint,
    trajectory_of,
)
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.testing import free_port
from mtrl_runtime.types import Rollout, RolloutStatus, Task, Turn

TASKS = [{"id": f"t{i}", "prompt": f"task {i}", "ground_truth": 42} for i in range(3)]
MIXED = ["ANSWER 42", "ANSWER 7", "nothing", "ANSWER 7"]
BLOCK = re.compile(r'<trajectory id="(t\d+)">.*?\[final answer\] (.*?)\n', re.DOTALL)

Scorer = Callable[[int, str], float]  # (position from 0, final answer) -> score


def judge_script(score: Scorer, calls: list[str] | None = None) -> Callable[[Any, str], str]:
    """A judge that scores each trajectory of the prompt by ``score(position, final answer)``, as JSON."""
    def reply(request: Any, prompt: str) -> str:
        if calls is not None:
            calls.append(prompt)
        found = BLOCK.findall(prompt)
        assert found, prompt[-400:]
        return json.dumps({"scores": [{"id": label, "explanation": "seen", "score": round(score(i, answer), 3)}
                                      for i, (label, answer) in enumerate(found)]})
    return reply


def faithful(position: int, answer: str) -> float:
    return 1.0 if answer.strip() == "ANSWER 42" else 0.0


def first_is_best(position: int, answer: str) -> float:
    return 1.0 if position == 0 else faithful(position, answer) * 0.5


def judge_config() -> MtrlConfig:
    return MtrlConfig.from_dict({"advanced": {"server": {"inference_mode": True}}})


@pytest.fixture
def judge_url(served: Any, tiny_tok: Any) -> Callable[..., str]:
    """Serve a scripted judge on loopback; returns its OpenAI base URL."""
    def start(script: Callable[[Any, str], str]) -> str:
        return served(ScriptedEngine(tiny_tok, script), judge_config()).url + "/v1"
    return start


def check_config(tmp_path: Path) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "group_size": 4, "max_turns": 4,
                 "sampling_params": {"max_tokens": 64}, "val_sampling_params": {"max_tokens": 64}},
        "advanced": {"rollout_timeout_s": 30},
    })


def by_sample(replies: list[str]) -> Any:
    index = {sample_seed(0, t["id"], j): j for t in TASKS for j in range(len(replies))}
    return lambda request, prompt: replies[index[request.sampling.seed]]


def audit(tmp_path: Path, tok: Any, url: str, replies: list[str] = MIXED, **kwargs: Any) -> Any:
    judge = tmp_path / "judge.yaml"
    judge.write_text(f"base_url: {url}\nmodel: judge\nrubric_file: rubric.md\n")
    (tmp_path / "rubric.md").write_text("Only the exact answer ANSWER 42 is correct.\n")
    return check_reward(agents.make_agent(agents.answer_score, tools=[]), TASKS, check_config(tmp_path),
                        engine=ScriptedEngine(tok, by_sample(replies)), samples=len(replies),
                        strict_scorer=agents.strict_answer, judge=judge, **kwargs)


def test_a_faithful_judge_passes_the_audit_and_is_fit_to_train_on(tmp_path, tiny_tok, judge_url):
    prompts: list[str] = []
    checklist = audit(tmp_path, tiny_tok, judge_url(judge_script(faithful, prompts)))
    print(checklist)
    assert checklist.ok, str(checklist)
    assert {i.status for i in checklist.items} == {Status.PASS}
    assert checklist.item("judge orders trajectories as the reference does").evidence["order_agreement"] == 1.0
    assert checklist.item("no position bias (rankings under shuffles)").evidence["ranking_changed_frac"] == 0.0
    assert len(prompts) == 3 * 3  # three groups, each judged in three orders
    assert "Only the exact answer ANSWER 42 is correct." in prompts[0]  # the rubric file reached the judge


def test_a_judge_that_favours_the_first_trajectory_is_caught(tmp_path, tiny_tok, judge_url):
    checklist = audit(tmp_path, tiny_tok, judge_url(judge_script(first_is_best)))
    print(checklist)
    position = checklist.item("no position bias (score vs position)")
    assert position.status is Status.FAIL and position.evidence["position_correlation"] < -0.3
    assert "earlier trajectories score higher" in position.detail
    assert checklist.item("no position bias (rankings under shuffles)").status is Status.FAIL
    verdict = checklist.item("the judge is fit to train on")
    assert verdict.status is Status.FAIL and "no position bias (score vs position)" in verdict.detail
    assert not checklist.ok


def test_a_judge_that_pays_for_length_is_caught(tmp_path, tiny_tok, judge_url):
    replies = ["ANSWER 42", "ANSWER 7 since the lookup said seven and I am quite sure of it", "ANSWER 7",
               "nothing at all, sorry, I could not find the value anywhere in the records"]
    checklist = audit(tmp_path, tiny_tok, judge_url(judge_script(lambda i, a: min(1.0, len(a) / 70))), replies)
    length = checklist.item("no length bias")
    assert length.status is Status.FAIL and length.evidence["length_correlation"] > 0.5, str(checklist)
    assert checklist.item("no position bias (score vs position)").status is Status.PASS
    assert checklist.item("the judge is fit to train on").status is Status.FAIL


def _trajectories(n: int) -> list[Any]:
    task = Task(id="t1", prompt="say 42", ground_truth=42)
    out = []
    for i in range(n):
        turn = Turn(f"r{i}", 0, ({"role": "user", "content": "say 42"},), (1,), (2,), (-0.1,), "stop", f"ANSWER {i}")
        out.append(trajectory_of(Rollout(f"r{i}", "t1", "g", RolloutStatus.COMPLETED, turns=(turn,)), task))
    return out


def test_a_malformed_or_incomplete_reply_is_an_error_naming_the_trajectory_and_the_reply(judge_url):
    trajectories = _trajectories(3)
    prose = GroupJudge(judge_url(lambda request, prompt: "t1 looks best to me"), "judge")
    with pytest.raises(JudgeReplyError, match=r"rollouts 'r0', 'r1', 'r2' is not JSON.*'t1 looks best to me'"):
        prose.judge(trajectories)
    partial = GroupJudge(judge_url(lambda r, p: '```json\n{"scores": [{"id": "t1", "score": 1}, '
                                                '{"id": "t3", "score": 0.5}]}\n```'), "judge")
    with pytest.raises(JudgeReplyError, match=r"no score for trajectory t2 \(rollout 'r1'\) \(2 of 3 scored\)"):
        partial.judge(trajectories)
    high = GroupJudge(judge_url(lambda r, p: json.dumps({"scores": [{"id": f"t{i}", "score": 7} for i in (1, 2, 3)]})),
                      "judge")
    with pytest.raises(JudgeReplyError, match=r"t1 \(rollout 'r0'\) the score 7; expected a number from 0 to 1"):
        high.judge(trajectories)
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: retried, then an error naming the rollouts
    with pytest.raises(JudgeError, match=r"failed for rollouts 'r0', 'r1', 'r2' after 2 attempt\(s\): ConnectError"):
        GroupJudge(down, "judge", attempts=2).judge(trajectories)
    good = GroupJudge(judge_url(judge_script(lambda i, a: 0.25 * i)), "judge").judge(trajectories)
    assert good.scores == (0.0, 0.25, 0.5)
    assert good.call.model == "judge" and good.call.input_tokens > 0 and good.call.output_tokens > 0


def test_the_judges_calls_share_one_tls_context(judge_url, monkeypatch):
    """httpx builds a verified TLS context (the CA bundle loaded: ~20 ms of CPU) for every client it makes, and the
    judge makes one per call: they all take the process's one (``mtrl_runtime.tls``), built once at most."""
    built: list[int] = []
    make = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or make(*a, **k))
    judge = GroupJudge(judge_url(judge_script(lambda i, a: 0.5 * i)), "judge")
    for _ in range(3):
        assert judge.judge(_trajectories(2)).scores == (0.0, 0.5)
    assert len(built) <= 1, f"{len(built)} TLS contexts built for 3 judge calls"


def test_judge_specs_name_the_bad_field_and_the_policy_endpoint_is_refused(tmp_path):
    with pytest.raises(JudgeSpecError, match="base_url: .*expected an http"):
        JudgeSpec.of({"base_url": "judge.local", "model": "m"})
    with pytest.raises(JudgeSpecError, match="temperatur"):
        JudgeSpec.of({"base_url": "http://h/v1", "model": "m", "temperatur": 0})
    with pytest.raises(JudgeSpecError, match=r"prompt_template: .*\{trajectories\}"):
        JudgeSpec.of({"base_url": "http://h/v1", "model": "m", "prompt_template": "score them"})
    with pytest.raises(JudgeSpecError, match="'NO_SUCH_JUDGE_KEY' is not set"):
        GroupJudge.from_spec({"base_url": "http://h/v1", "model": "m", "api_key_env": "NO_SUCH_JUDGE_KEY"})
    with pytest.raises(ValueError, match="is the coordinator's own endpoint"):
        refuse_policy_endpoint("http://localhost:8731/v1", "http://127.0.0.1:8731")
    refuse_policy_endpoint("http://127.0.0.1:8732/v1", "http://127.0.0.1:8731")  # another server: fine
    config = MtrlConfig.from_dict({"advanced": {"group_judge": {"base_url": "http://h/v1", "model": "m",
                                                                "api_key": "sk-secret"}}})
    assert "sk-secret" not in json.dumps(config.model_dump(mode="json"))  # the stored run config hides the key


# -- training with the judge ---------------------------------------------------------------------

TRAIN = [{"id": f"train-{n}", "prompt": f"question {n}", "ground_truth": 42} for n in "ab"]
JUDGED = {"ANSWER 42": 0.9, "ANSWER 7": 0.2}


def train_config(run_dir: Path, model_dir: Path, judge: dict[str, Any], port: int = 0) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"run_dir": str(run_dir), "model": str(model_dir), "group_size": 2, "train_batch_size": 2,
                 "max_steps": 2, "val_every": 0, "max_turns": 2, "lora_rank": 4, "lora_alpha": 8,
                 "sampling_params": {"max_tokens": 16}},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 30, "group_judge": judge,
                     "server": {"port": port}},
    })


def alternating() -> Callable[[Any, str], str]:
    count: dict[str, int] = {}

    def reply(request: Any, prompt: str) -> str:
        task = next(t["id"] for t in TRAIN if t["prompt"] in prompt)
        count[task] = count.get(task, 0) + 1
        return "ANSWER 42" if count[task] % 2 else "ANSWER 7"
    return reply


def test_training_stores_the_judges_scores_as_rewards_and_records_its_calls(tmp_path, tiny_tok, tiny_model_dir,
                                                                            judge_url):
    import torch

    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    prompts: list[str] = []
    url = judge_url(judge_script(lambda i, answer: JUDGED[answer.strip()], prompts))
    policy = ScriptedEngine(tiny_tok, alternating())
    trainer = MultiTurnRLTrainer(
        agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TRAIN,
        config=train_config(tmp_path / "run", tiny_model_dir, {"base_url": url, "model": "judge"}),
        engine=policy, tracking=False,
    )
    result = trainer.train(progress=False)
    assert result.final_step == 2
    assert len(prompts) == 4  # one request per group: 2 steps x 2 tasks
    assert policy.calls == 8  # the policy answered the agents only: 2 steps x 2 tasks x 2 rollouts
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        rollouts = [r for r in store.rollouts() if r.step is not None]
        assert len(rollouts) == 8
        for r in rollouts:
            answer = r.turns[-1].completion_text
            assert r.reward == JUDGED[answer] and not r.reward_defaulted  # the judge's score is the stored reward
            assert r.metrics["agent_reward"] == float(answer == "ANSWER 42")  # the agent's own, kept
            assert r.metrics["judged"] == 1.0 and r.metrics["agent_reward_defaulted"] == 0.0
            [call] = r.model_calls  # the judge's request, recorded beside the turns, never a turn
            assert call.model == "judge" and call.protocol == "openai" and call.status == "success"
            assert call.latency_s > 0 and call.input_tokens > 0 and call.output_tokens > 0
            assert len(r.turns) == 1
            assert store.trained_step(r.id) == r.step
        rewards = [s for s, name, _ in store.metric_history("rollout/reward/mean")]
        assert rewards == [0, 1]
        means = [v for _, _, v in store.metric_history("rollout/reward/mean")]
        assert means == pytest.approx([0.55, 0.55])  # (0.9 + 0.2) / 2: the judged rewards trained
    finally:
        store.close()


def test_a_judge_at_the_policys_own_endpoint_is_refused_at_startup(tmp_path, tiny_tok, tiny_model_dir):
    from mtrl_runtime.training import MultiTurnRLTrainer

    port = free_port()
    trainer = MultiTurnRLTrainer(
        agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TRAIN,
        config=train_config(tmp_path / "run", tiny_model_dir,
                            {"base_url": f"http://localhost:{port}/v1", "model": "policy"}, port=port),
        engine=ScriptedEngine(tiny_tok, alternating()), tracking=False,
    )
    with pytest.raises(ValueError, match=r"advanced.group_judge.base_url: .* is the coordinator's own endpoint"):
        trainer.train(progress=False)
