"""Validation passes and diagnostics inside a real training run (scripted engine, tiny model, real SQLite).

The trainer runs the whole stack: coordinator on 127.0.0.1, an OpenAI-client
``@rollout`` agent in-process, the tiny model's LoRA update, adapters pushed
to the scripted engine. The script answers by the request's sampling:
training requests (temperature 1.0) answer by the rollout's place in its group
(read from its seed, ``seeds.rollout_seed``): right for the first, wrong for
the second, so every group of two has one success in whatever order the
groups' calls interleave (an asynchronous run collects two steps at once);
validation requests (temperature 0.5, ``val_sampling_params``) answer by
sample index, right for sample 0 only.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import _eval_agents as agents
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.evaluation import sample_seed
from mtrl_runtime.rollouts import group_id_for
from mtrl_runtime.seeds import rollout_seed
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.training import MultiTurnRLTrainer

TRAIN = [{"id": f"train-{n}", "prompt": f"question {n}", "ground_truth": 42} for n in "ab"]
VAL = [{"id": f"val-{n}", "prompt": f"check {n}", "ground_truth": 42} for n in "xy"]
VAL_TEMPERATURE = 0.5
RIGHT, WRONG = "ANSWER 42", "ANSWER 7"


def config(run_dir: Path, model_dir: Path, **core: Any) -> MtrlConfig:
    base = {"run_dir": str(run_dir), "model": str(model_dir), "group_size": 2, "train_batch_size": 2,
            "max_steps": 4, "val_every": 2, "pass_k_values": [1, 2], "max_turns": 2, "lora_rank": 4,
            "lora_alpha": 8, "sampling_params": {"max_tokens": 16},
            "val_sampling_params": {"temperature": VAL_TEMPERATURE, "max_tokens": 16}}
    base.update(core)
    return MtrlConfig.from_dict({"core": base, "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 30}})


class Script:
    """Replies for training (``train(task, serial)``: the serial-th rollout of a group) and validation (by sample)."""

    def __init__(self, train: Callable[[str, int], str]) -> None:
        self.train = train
        self.sample = {sample_seed(0, t["id"], j): j for t in VAL for j in range(2)}
        # a training rollout's seed (run seed 0; its one call is turn 0, which keeps it) -> its serial in its group
        self.serial = {rollout_seed(0, group_id_for(step, g), n): n for step in range(8) for g in range(2)
                       for n in range(2)}
        self.sampling: dict[str, tuple[float, int | None]] = {}  # rollout id -> (temperature, seed)

    def __call__(self, request: Any, prompt: str) -> str:
        self.sampling[request.rollout_id] = (request.sampling.temperature, request.sampling.seed)
        if request.sampling.temperature == VAL_TEMPERATURE:
            return RIGHT if self.sample[request.sampling.seed] == 0 else WRONG
        task = next(t["id"] for t in TRAIN if t["prompt"] in prompt)
        return self.train(task, self.serial[request.sampling.seed])


def alternating(task: str, serial: int) -> str:
    return RIGHT if serial == 0 else WRONG  # a group's two rollouts of one task: one right, one wrong


def train(tmp_path: Path, model_dir: Path, tok: Any, script: Script, *, strict: Any = agents.strict_answer,
          resume: bool = False, tracking: bool = False, on_step: Any = None, **core: Any) -> Any:
    torch.set_num_threads(1)
    trainer = MultiTurnRLTrainer(
        agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TRAIN,
        config=config(tmp_path / "run", model_dir, **core), engine=ScriptedEngine(tok, script),
        validation_dataset=VAL, strict_scorer=strict, resume=resume, tracking=tracking,
    )
    return trainer.train(progress=False, on_step=on_step)


def val_steps(store: SQLiteStore) -> list[int]:
    return [s for s, _, _ in store.metric_history("val/reward/mean")]


def rules(report: Any) -> list[str]:
    return [line.split("] ", 1)[1].split(":", 1)[0] for line in report.warnings if line.startswith("diagnosis")]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, tiny_model_dir, tiny_tok):
    tmp = tmp_path_factory.mktemp("healthy")
    script = Script(alternating)
    result = train(tmp, tiny_model_dir, tiny_tok, script)
    store = SQLiteStore(tmp / "run" / "trajectories.db")
    yield result, store, script
    store.close()


def test_validation_runs_at_step_0_every_val_every_and_after_the_last_step(healthy):
    result, store, _ = healthy
    with_val = [r.step for r in result.reports if "val/reward/mean" in r.metrics]
    assert with_val == [0, 2, 3]  # the last report carries the pass after the last step
    assert val_steps(store) == [0, 2, 4]  # logged at the step whose policy it measured
    for report in result.reports:
        if "val/reward/mean" in report.metrics:
            m = report.metrics
            assert m["val/reward/mean"] == m["val/reward/pass_k_1"] == m["val/strict/success_rate"] == 0.5
            assert m["val/reward/pass_k_2"] == 1.0 and m["val/strict/disagree_frac"] == 0.0
            assert m["time/validation"] > 0
    assert result.reports[0].metrics["val/reward/base_success"] == 0.5  # before the first update only
    assert all("val/reward/base_success" not in r.metrics for r in result.reports[1:])
    history = defaultdict(dict)
    for step, name, value in store.metric_history():
        history[step][name] = value
    assert history[2]["val/reward/mean"] == 0.5 and "rollout/reward/mean" in history[2]  # one commit per step
    assert set(history[4]) >= {"val/reward/mean", "val/reward/pass_k_2"} and "rollout/reward/mean" not in history[4]


def test_each_step_and_each_pass_reports_the_template_drift_of_its_rollouts(healthy, tiny_tok):
    """The drift figure of ``mtrl check template``, logged by the loop per step and by each validation pass."""
    from mtrl_runtime.chat import ChatRenderer
    from mtrl_runtime.chat.formats import CHAT_FORMATS, drift_fraction

    result, store, _ = healthy
    renderer = ChatRenderer(tiny_tok, fallback=CHAT_FORMATS.get("hermes").template)
    for report in result.reports:
        trained = [r for r in store.rollouts() if r.step == report.step and not r.group_id.startswith("val-")]
        assert trained and report.metrics["rollout/template_drift_frac"] == drift_fraction(renderer, (r.turns for r in trained))
        if "val/reward/mean" in report.metrics:
            assert report.metrics["val/template_drift_frac"] == 0.0  # hermes without thinking renders as trained
    logged = [name for _, name, _ in store.metric_history()]
    assert "rollout/template_drift_frac" in logged and "val/template_drift_frac" in logged


def test_each_pass_measures_the_policy_of_its_step_with_val_sampling_and_fixed_seeds(healthy):
    _, store, script = healthy
    by_group = defaultdict(list)
    for rollout in store.rollouts():
        if rollout.group_id.startswith("val-"):
            by_group[rollout.group_id].append(rollout)
    assert sorted(by_group) == [f"val-s{s}-t{i}" for s in (0, 2, 4) for i in (0, 1)]
    for group_id, rollouts in by_group.items():
        step = int(group_id.split("-")[1][1:])
        assert len(rollouts) == 2  # k = max(pass_k_values) samples per task
        assert {t.policy_version for r in rollouts for t in r.turns} == {step}
        task = rollouts[0].task_id
        assert {script.sampling[r.id] for r in rollouts} == {(VAL_TEMPERATURE, sample_seed(0, task, j)) for j in (0, 1)}


def test_validation_rollouts_are_never_trained_and_not_counted_in_steps(healthy):
    result, store, script = healthy
    rollouts = store.rollouts(with_turns=False)
    validation = [r for r in rollouts if r.group_id.startswith("val-")]
    training = [r for r in rollouts if not r.group_id.startswith("val-")]
    assert len(validation) == 3 * 2 * 2 and all(r.step is None for r in validation)
    assert all(store.trained_step(r.id) is None for r in validation)
    assert all(r.metrics["rollout/count"] == 4 for r in result.reports)  # train_batch_size x group_size
    assert Counter(r.step for r in training) == {0: 4, 1: 4, 2: 4, 3: 4}
    assert all(store.trained_step(r.id) == r.step for r in training)  # every group had signal
    assert all(script.sampling[r.id][0] == 1.0 for r in training)


@pytest.mark.timeout(120)
def test_async_runs_validate_the_policy_of_their_step_while_later_steps_collect(tmp_path, tiny_model_dir, tiny_tok):
    torch.set_num_threads(1)
    cfg = config(tmp_path / "run", tiny_model_dir).with_overrides(
        {"advanced.async_config.enabled": True, "advanced.async_config.max_steps_off_policy": 1})
    result = MultiTurnRLTrainer(agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TRAIN,
                                config=cfg, engine=ScriptedEngine(tiny_tok, Script(alternating)), validation_dataset=VAL,
                                tracking=False).train(progress=False)
    assert [r.step for r in result.reports if "val/reward/mean" in r.metrics] == [0, 2, 3]
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        versions = defaultdict(set)
        for rollout in store.rollouts():
            if rollout.group_id.startswith("val-"):
                versions[rollout.group_id.split("-")[1]] |= {t.policy_version for t in rollout.turns}
        assert versions == {"s0": {0}, "s2": {2}, "s4": {4}}
        assert val_steps(store) == [0, 2, 4]
    finally:
        store.close()


def test_an_early_stop_still_validates_the_policy_it_leaves(tmp_path, tiny_model_dir, tiny_tok):
    seen = []

    def stop_after_step_1(report: Any) -> bool:
        seen.append("val/reward/mean" in report.metrics)
        return report.step == 1

    result = train(tmp_path, tiny_model_dir, tiny_tok, Script(alternating), on_step=stop_after_step_1)
    assert [r.step for r in result.reports] == [0, 1] and seen == [True, False]
    assert result.reports[-1].metrics["val/reward/pass_k_2"] == 1.0  # the pass after the stop joined the report
    assert (tmp_path / "run" / "checkpoints" / "step-000002").is_dir()
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        assert val_steps(store) == [0, 2]
        assert {t.policy_version for r in store.rollouts() if r.group_id.startswith("val-s2-") for t in r.turns} == {2}
    finally:
        store.close()


def test_a_healthy_run_has_no_warnings(healthy):
    result, _, _ = healthy
    assert [r.warnings for r in result.reports] == [()] * 4
    assert all(r.metrics["analysis/zero_adv_frac"] == 0.0 for r in result.reports)


@pytest.mark.timeout(120)
def test_diagnostics_fire_into_reports_mlflow_and_the_file(tmp_path, tiny_model_dir, tiny_tok):
    from mlflow import MlflowClient

    def never(text: str, ground_truth: Any) -> float:
        return 0.0  # the strict scorer accepts nothing: the base model has no foothold

    result = train(tmp_path, tiny_model_dir, tiny_tok, Script(lambda task, n: WRONG), strict=never, tracking=True)
    by_step = {r.step: rules(r) for r in result.reports}
    # strict success 0 at the step-0 pass; every group scores alike from step 0: said at the third step
    assert by_step == {0: ["base_zero_success"], 1: [], 2: ["zero_advantage_groups"], 3: []}
    assert "first fix: simplify the task" in result.reports[0].warnings[0]
    assert result.reports[0].metrics["val/reward/base_success"] == 0.0
    assert result.reports[0].metrics["val/reward/success_rate"] == 0.5  # the reward alone would have said 0.5
    assert all(r.metrics["analysis/zero_adv_frac"] == 1.0 for r in result.reports)
    lines = [json.loads(x) for x in (tmp_path / "run" / "diagnostics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["rule"]) for x in lines] == [(0, "base_zero_success"), (2, "zero_advantage_groups")]
    client = MlflowClient(tracking_uri=result.tracking_uri)
    run = client.get_run(result.mlflow_run_id)
    assert "first fix" in run.data.tags["mtrl.diagnosis.base_zero_success"]
    assert [m.step for m in client.get_metric_history(result.mlflow_run_id, "diagnostics/zero_advantage_groups")] == [2]
    assert [m.step for m in client.get_metric_history(result.mlflow_run_id, "val/reward/mean")] == [0, 2, 4]
    assert [m.step for m in client.get_metric_history(result.mlflow_run_id, "val/strict/reward_only_frac")] == [0, 2, 4]


@pytest.mark.timeout(120)
def test_a_resumed_run_repeats_no_pass_and_no_finding(tmp_path, tiny_model_dir, tiny_tok):
    def never(text: str, ground_truth: Any) -> float:
        return 0.0

    first = train(tmp_path, tiny_model_dir, tiny_tok, Script(lambda task, n: WRONG), strict=never, max_steps=2)
    assert [rules(r) for r in first.reports] == [["base_zero_success"], []]
    second = train(tmp_path, tiny_model_dir, tiny_tok, Script(lambda task, n: WRONG), strict=never, max_steps=4,
                   resume=True)
    assert second.start_step == 2 and [r.step for r in second.reports] == [2, 3]
    assert "val/reward/mean" not in second.reports[0].metrics  # step 2's pass ran after the first run's last step
    # the history of the first run counts: all-alike groups at steps 0, 1, 2 fire at step 2, said once overall
    assert [rules(r) for r in second.reports] == [["zero_advantage_groups"], []]
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        assert val_steps(store) == [0, 2, 4]
        groups = Counter(r.group_id for r in store.rollouts(with_turns=False) if r.group_id.startswith("val-"))
        assert groups == {f"val-s{s}-t{i}": 2 for s in (0, 2, 4) for i in (0, 1)}
    finally:
        store.close()


def test_validation_task_ids_must_not_name_other_training_tasks(tmp_path, tiny_model_dir, tiny_tok):
    clash = [{"id": "train-a", "prompt": "something else"}]
    trainer = MultiTurnRLTrainer(agent_env=agents.agent, training_dataset=TRAIN, validation_dataset=clash,
                                 config=config(tmp_path / "run", tiny_model_dir), engine=ScriptedEngine(tiny_tok, [RIGHT]),
                                 tracking=False)
    with pytest.raises(ValueError, match="validation_dataset: task id 'train-a' names a different training task"):
        trainer.train(progress=False)
    with pytest.raises(ValueError, match="strict_scorer: .* give a validation_dataset"):
        MultiTurnRLTrainer(agent_env=agents.agent, training_dataset=TRAIN, strict_scorer=agents.strict_answer)


@pytest.mark.timeout(120)
def test_cli_train_with_a_validation_split_and_a_strict_scorer(tmp_path, tiny_model_dir, capsys):
    import yaml

    from mtrl_runtime.cli import main

    cfg = {"core": {"engine": "scripted", "model": str(tiny_model_dir), "run_dir": str(tmp_path / "run"),
                    "group_size": 2, "train_batch_size": 2, "max_steps": 2, "val_every": 1, "pass_k_values": [1, 2],
                    "max_turns": 2, "lora_rank": 4, "lora_alpha": 8},
           "advanced": {"engine_options": {"script": [RIGHT]}, "rollout_timeout_s": 30, "checkpoint_every": 0}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRAIN))
    held_out = [{**VAL[0], "split": "val"}, {**VAL[1], "split": "test"}]
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(t) + "\n" for t in held_out))
    args = ["train", str(tmp_path / "cfg.yaml"), "--agent", "_eval_agents:agent", "--dataset", str(tmp_path / "train.jsonl"),
            "--no-mlflow", "--strict", "_eval_agents:strict_answer"]

    assert main([*args, "--val-dataset", str(tmp_path / "held_out.jsonl"), "--val-split", "val"]) == 0
    captured = capsys.readouterr()
    assert "validation: reward 1.000  pass@1 1.000  pass@2 1.000  strict 1.000" in captured.err
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        assert val_steps(store) == [0, 1, 2]
        validation = [r for r in store.rollouts(with_turns=False) if r.group_id.startswith("val-")]
        assert {r.task_id for r in validation} == {"val-x"} and len(validation) == 3 * 2  # the test row is left out
    finally:
        store.close()
    with pytest.raises(ValueError, match="--val-split: give --val-dataset"):
        main([*args, "--val-split", "val", "--run-dir", str(tmp_path / "other")])
