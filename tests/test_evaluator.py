"""The evaluator end to end: real coordinator on 127.0.0.1, real OpenAI-client agents, real SQLite.

The scripted engine answers each rollout by (task, sample seed, policy
version), so every outcome is known in advance and pass@k, rates and the
reward-hacking detector are checked against hand-computed values. The hf
test runs the tiny model with a real peft adapter, base and fine-tuned side
by side on one engine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import _eval_agents as agents
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.evaluation import (
    FINE_TUNED,
    MultiTurnRLEvaluator,
    StrictScorer,
    base_policy,
    run_validation,
    sample_seed,
)
from mtrl_runtime.seeds import turn_seed
from mtrl_runtime.types import GenerationRequest, SamplingParams

LOOKUP = ScriptedReply.tool_call("lookup", {"key": "A1"})
ADD = ScriptedReply.tool_call("add", {"a": 1, "b": 2})
LONG = "ANSWER 0" + " zzzz" * 60  # far past the 64-token cap


def config(tmp_path: Path, **core: Any) -> MtrlConfig:
    base = {"run_dir": str(tmp_path / "run"), "pass_k_values": [1, 2, 4, 8], "max_turns": 3,
            "val_sampling_params": {"temperature": 0.7, "max_tokens": 64}}
    base.update(core)
    return MtrlConfig.from_dict({"core": base, "advanced": {"rollout_timeout_s": 30}})


def rows(*names: str) -> list[dict[str, Any]]:
    return [{"id": f"t-{n}", "prompt": f"task {n}", "split": "test"} for n in names]


class Script:
    """Replies by (policy version, task, sample index); logs which rollout got which sample.

    The sample is known by its seed: ``sample_seed`` at turn 0, ``turn_seed`` of it at later turns."""

    def __init__(self, task_ids: list[str], samples: int, plan: Any, turns: int = 3) -> None:
        self.index = {turn_seed(sample_seed(0, t, j), turn): (t, j)
                      for t in task_ids for j in range(samples) for turn in range(turns)}
        self.plan = plan
        self.seen: dict[str, tuple[int, str, int]] = {}  # rollout id -> (version, task, sample)

    def __call__(self, request: GenerationRequest, prompt: str) -> Any:
        task, j = self.index[request.sampling.seed]
        self.seen[request.rollout_id] = (request.adapter, task, j)
        return self.plan(request.adapter, task, j, request.turn_index)


def passk_plan(version: int, task: str, j: int, turn: int) -> Any:
    """Fine-tuned (1): t-all 4/4, t-one 1/4, t-none 0/4. Base (0): t-all 1/4, the rest 0/4."""
    if task == "t-all":
        if version == 0 and j > 0:
            return "ANSWER 7"
        return LOOKUP if turn == 0 else "ANSWER 42"
    if task == "t-one":
        if j == 0 and version == 1:
            return "ANSWER 42"
        return ADD if turn == 0 else "ANSWER 7"
    if j == 0:
        return LOOKUP  # forever: the turn budget runs out after 3 turns
    return LONG


def test_pass_at_k_rates_and_base_side_by_side_match_hand_computed_values(tmp_path, tiny_tok):
    tasks = rows("all", "one", "none")
    script = Script([t["id"] for t in tasks], 4, passk_plan)
    engine = ScriptedEngine(tiny_tok, script)
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=tasks, config=config(tmp_path),
        engine=engine, adapter=tmp_path / "adapter", evaluate_base_model=True, max_samples=4, tracking=False,
    )
    result = evaluator.evaluate()

    ft, base = result.fine_tuned.metrics, result.base.metrics
    # pass@k by hand: t-one has n=4, c=1 -> pass@2 = 1 - C(3,2)/C(4,2) = 1/2; k=8 > n is left out
    assert ft["val/reward/pass_k_1"] == pytest.approx((1 + 0.25 + 0) / 3)
    assert ft["val/reward/pass_k_2"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert ft["val/reward/pass_k_4"] == pytest.approx((1 + 1 + 0) / 3)
    assert "val/reward/pass_k_8" not in ft
    assert base["val/reward/pass_k_1"] == pytest.approx(0.25 / 3)
    assert base["val/reward/pass_k_2"] == pytest.approx(0.5 / 3)
    assert base["val/reward/pass_k_4"] == pytest.approx(1 / 3)
    assert ft["val/reward/mean"] == pytest.approx(5 / 12) and base["val/reward/mean"] == pytest.approx(1 / 12)
    # responses: t-all 4x2, t-one 1 + 3x2, t-none 3 (turn budget) + 3x1 (cut at the token cap) = 21
    assert ft["val/truncated_frac"] == pytest.approx(3 / 21)
    assert ft["val/turn_limit_frac"] == pytest.approx(1 / 12)
    assert ft["val/completed_frac"] == 1.0
    assert ft["val/template_drift_frac"] == base["val/template_drift_frac"] == 0.0  # the check's figure, per side
    assert ft["val/tool_calls/lookup_frac"] == pytest.approx(7 / 10)
    assert ft["val/tool_calls/add_frac"] == pytest.approx(3 / 10)
    assert ft["val/metrics/answered"] == pytest.approx(11 / 12)  # all but the turn-budget sample
    # the same tasks and seeds on both sides; each side recorded under its own policy version
    by_version: dict[int, set] = {0: set(), 1: set()}
    for version, task, j in script.seen.values():
        by_version[version].add((task, j))
    assert by_version[0] == by_version[1] == {(t["id"], j) for t in tasks for j in range(4)}
    assert {r.policy_version for r in result.fine_tuned.rollouts} == {1}
    assert {r.policy_version for r in result.base.rollouts} == {0}
    assert engine.policy_version == 1  # the adapter is served again afterwards
    assert all(r.step is None and r.group_id.startswith("eval-") for r in result.base.rollouts)
    assert result.metrics["base/val/reward/mean"] == pytest.approx(1 / 12)

    report = json.loads(result.report.json.read_text())
    assert set(report["models"]) == {"fine_tuned", "base"}
    assert report["models"]["fine_tuned"]["pass_k"] == {"1": pytest.approx(5 / 12), "2": 0.5, "4": pytest.approx(2 / 3)}
    assert report["models"]["base"]["per_task"]["t-all"] == {"samples": 4, "successes": 1, "mean_reward": 0.25}
    markdown = result.report.markdown.read_text()
    assert "| mean reward | 0.417 | 0.083 | +0.333 |" in markdown
    assert result.report.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the reward-hacking detector -----------------------------------------------------------------

STRICT_OK = '<final_output>{"value": 42}</final_output>'
LOOSE = "value: 42"  # the planted hack: the reward accepts it, the strict format does not
WRONG = '<final_output>{"value": 7}</final_output>'
STRICT_OK_REWARD_MISSES = '<final_output>{"value": 42, "note": "no error"}</final_output>'
HACK_REPLIES = [STRICT_OK, LOOSE, WRONG, STRICT_OK_REWARD_MISSES]


def lenient_reward(text: str, task: Any) -> float:
    """Any 42 anywhere counts, unless the text mentions an error (a lenient parser with a bug)."""
    return float("42" in text and "error" not in text.lower())


def strict_value(text: str, ground_truth: Any) -> float:
    """Exactly one final_output block holding a JSON object whose value equals the ground truth."""
    match = re.fullmatch(r"\s*<final_output>(.*)</final_output>\s*", text, re.S)
    if not match:
        return 0.0
    try:
        answer = json.loads(match.group(1))
    except ValueError:
        return 0.0
    return float(isinstance(answer, dict) and answer.get("value") == ground_truth)


def test_planted_reward_hack_is_flagged_with_exactly_the_right_trajectories(tmp_path, tiny_tok, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's trace exporter writes to the working folder's default store
    tasks = [{"id": f"q{i}", "prompt": f"question {i}", "ground_truth": 42} for i in range(3)]
    script = Script([t["id"] for t in tasks], 4, lambda version, task, j, turn: HACK_REPLIES[j])
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(lenient_reward, tools=[]), dataset=tasks,
        config=config(tmp_path, pass_k_values=[1, 4]), engine=ScriptedEngine(tiny_tok, script),
        strict_scorer=strict_value, tracking=True,
    )
    result = evaluator.evaluate()
    side = result.base  # no adapter: the model as it is
    hacked = {rid for rid, (_, _, j) in script.seen.items() if j == 1}
    missed = {rid for rid, (_, _, j) in script.seen.items() if j == 3}
    assert len(hacked) == 3 and len(missed) == 3
    assert {d.rollout_id for d in side.strict.reward_only} == hacked
    assert {d.rollout_id for d in side.strict.strict_only} == missed
    assert {d.final_text for d in side.strict.reward_only} == {LOOSE}
    assert {d.task_id for d in side.strict.reward_only} == {"q0", "q1", "q2"}
    assert side.metrics["val/strict/reward_only_frac"] == pytest.approx(3 / 12)
    assert side.metrics["val/reward/pass_k_1"] == pytest.approx(0.5)  # what the reward claims
    assert side.metrics["val/strict/pass_k_1"] == pytest.approx(0.5)  # different trajectories, same rate
    markdown = result.report.markdown.read_text()
    assert "suspected reward hacking): 3 trajectories" in markdown
    assert all(rid in markdown for rid in hacked)

    from mlflow import MlflowClient

    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.mlflow_run_id)
    assert run.data.metrics["val/strict/reward_only_frac"] == pytest.approx(0.25)
    assert {a.path for a in client.list_artifacts(result.mlflow_run_id, "evaluation")} >= {
        "evaluation/eval_report.md", "evaluation/eval_report.json", "evaluation/eval_report.png"}


def test_the_aircraft_lenient_reward_shows_up_against_its_strict_score(tmp_path, tiny_tok):
    from examples.aircraft_inspection.reward import format_answer, lenient_reward as aircraft_lenient, strict_score

    instances = Path(__file__).resolve().parents[1] / "examples/aircraft_inspection/instances/test.jsonl"
    rows_ = [json.loads(line) for line in instances.read_text().splitlines()[:2]]
    truths = {r["prompt"]: r["ground_truth"] for r in rows_}

    def loose(gt: dict) -> str:  # key=value text, no tags: the lenient parser takes it
        return " ".join(f"{k}={str(v).lower()}" for k, v in gt.items())

    def replies(request: GenerationRequest, prompt: str) -> str:
        gt = next(v for p, v in truths.items() if p in prompt)
        return format_answer(gt) if request.sampling.seed % 2 else loose(gt)

    agent = agents.make_agent(lambda text, task: aircraft_lenient(text, task.ground_truth), tools=[])
    result = MultiTurnRLEvaluator(agent_env=agent, dataset=rows_, config=config(tmp_path, pass_k_values=[4], val_sampling_params={"max_tokens": 512}),
                                  engine=ScriptedEngine(tiny_tok, replies), strict_scorer=strict_score,
                                  tracking=False).evaluate()
    side = result.base
    loose_ids = {r.id for r in side.rollouts if "final_output" not in r.turns[-1].completion_text}
    assert 0 < len(loose_ids) < len(side.rollouts)  # the seeds give both kinds
    assert all(r.reward == 1.0 for r in side.rollouts)  # the lenient reward takes both
    assert {d.rollout_id for d in side.strict.reward_only} == loose_ids
    assert not side.strict.strict_only


# -- the hf engine: base and a real peft adapter side by side ------------------------------------


def save_adapter(tok: Any, folder: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    from mtrl_runtime.testing import tiny_model

    peft_model = get_peft_model(tiny_model(tok), LoraConfig(
        r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"], init_lora_weights=False))
    peft_model.save_pretrained(folder)
    return folder


async def greedy(engine: Any, prompt_ids: tuple[int, ...]) -> tuple[int, ...]:
    gen = await engine.generate(GenerationRequest(prompt_ids, SamplingParams(temperature=0.0, max_tokens=8)))
    return gen.completion_ids


async def test_hf_base_and_adapter_side_by_side_on_one_engine(tmp_path, tiny_tok):
    from mtrl_runtime.engines import HFEngine
    from mtrl_runtime.testing import tiny_model

    adapter = save_adapter(tiny_tok, tmp_path / "adapter")
    engine = HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok)
    reference = HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok)
    try:
        cfg = config(tmp_path, pass_k_values=[1], val_sampling_params={"temperature": 0.0, "max_tokens": 8})
        cfg = cfg.with_overrides({"advanced.max_concurrency": 1})
        result = await MultiTurnRLEvaluator(
            agent_env=agents.make_agent(lambda text, task: float(bool(text)), tools=[]),
            dataset=rows("a", "b"), config=cfg, engine=engine, adapter=adapter,
            evaluate_base_model=True, tracking=False,
        ).aevaluate()
        ft_turns = {r.task_id: r.turns[0] for r in result.fine_tuned.rollouts}
        base_turns = {r.task_id: r.turns[0] for r in result.base.rollouts}
        for task_id, turn in base_turns.items():
            assert turn.policy_version == 0
            assert turn.completion_ids == await greedy(reference, turn.prompt_ids)  # the plain base model
        await reference.load_adapter(str(adapter), 1)
        for task_id, turn in ft_turns.items():
            assert turn.policy_version == 1
            assert turn.prompt_ids == base_turns[task_id].prompt_ids
            assert turn.completion_ids == await greedy(reference, turn.prompt_ids)  # base + adapter
        assert any(ft_turns[t].completion_ids != base_turns[t].completion_ids for t in ft_turns)
        # the two sides ran at once: base rows decoded in the same passes as the adapter's
        assert engine.stats.mixed_passes > 0 and engine.stats.base_rows_decoded > 0
        # afterwards the engine serves the adapter again
        first = ft_turns["t-a"]
        assert await greedy(engine, first.prompt_ids) == first.completion_ids
        async with base_policy(engine):
            assert await greedy(engine, first.prompt_ids) == base_turns["t-a"].completion_ids
        assert engine.policy_version == 1
    finally:
        await engine.close()
        await reference.close()


# -- the trainer's validation hook ---------------------------------------------------------------


async def test_run_validation_uses_the_trainers_dispatcher_and_reports_base_success(served, tmp_path, tiny_tok):
    from mtrl_runtime.executors import InProcessExecutor
    from mtrl_runtime.rollouts import Dispatcher, load_tasks

    tasks = load_tasks(rows("all", "one"))
    script = Script([t.id for t in tasks], 2, passk_plan)
    cfg = config(tmp_path, pass_k_values=[1, 2])
    handle = served(ScriptedEngine(tiny_tok, script), cfg)
    dispatcher = Dispatcher(handle.coordinator, InProcessExecutor(agents.make_agent(agents.answer_score)), cfg,
                            handle.url, handle.loop)
    side = await run_validation(dispatcher, tasks, step=0, strict_scorer=StrictScorer(agents.strict_answer))
    # base (version 0): t-all sample 0 succeeds, t-one none
    assert side.metrics["val/reward/pass_k_1"] == pytest.approx(0.25)
    assert side.metrics["val/reward/base_success"] == pytest.approx(0.25)
    assert side.metrics["val/strict/success_rate"] == pytest.approx(0.25)
    assert {r.group_id for r in side.rollouts} == {"val-s0-t0", "val-s0-t1"}
    assert all(r.step is None for r in handle.store.rollouts(with_turns=False))
    assert side.label != FINE_TUNED
