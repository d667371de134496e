"""``mtrl rescore``: a real short training run (scripted engine, tiny model, real SQLite), rescored offline.

The scripted policy answers task ``train-a`` right and wrong in turn
(``ANSWER 42`` / ``ANSWER 7``) and task ``train-b`` ``ANSWER 42`` /
``answer 42``: under the agent's reward (exact ``ANSWER 42``) both groups
of every step have one success, so every group carries signal. Rescored
with the original reward read off the stored trajectory, every figure the
loop logged comes back exactly; a lenient reward (any case) makes group b
score all alike (no signal, half the tokens without advantage) and is
caught by the strict scorer on every ``answer 42``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import _eval_agents as agents
from mtrl_runtime import cli
from mtrl_runtime.config import RUN_CONFIG_META, MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.evaluation import StrictScorer
from mtrl_runtime.rescore import REPRODUCED, load_run, rescore_run
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.training import MultiTurnRLTrainer

import _rescore_rewards as rewards

TRAIN = [{"id": f"train-{n}", "prompt": f"question {n}", "ground_truth": 42} for n in "ab"]
REPLIES = {"train-a": ("ANSWER 42", "ANSWER 7"), "train-b": ("ANSWER 42", "answer 42")}
STEPS = 3
REWARDS = Path(__file__).parent / "_rescore_rewards.py"


class Script:
    """Each task's replies in turn, so the two rollouts of a group differ."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()

    def __call__(self, request: Any, prompt: str) -> str:
        task = next(t["id"] for t in TRAIN if t["prompt"] in prompt)
        self.count[task] += 1
        return REPLIES[task][self.count[task] % 2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, tiny_tok) -> Path:
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("rescore") / "run"
    config = MtrlConfig.from_dict({
        "core": {"run_dir": str(folder), "model": str(tiny_model_dir), "group_size": 2, "train_batch_size": 2,
                 "max_steps": STEPS, "max_turns": 1, "lora_rank": 4, "lora_alpha": 8,
                 "sampling_params": {"max_tokens": 16}},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 30},
    })
    MultiTurnRLTrainer(agent_env=agents.make_agent(agents.answer_score, tools=[]), training_dataset=TRAIN,
                       config=config, engine=ScriptedEngine(tiny_tok, Script()), tracking=False).train(progress=False)
    return folder


def spec(name: str) -> str:
    return f"{REWARDS}:{name}"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_original_reward_reproduces_the_logged_rewards_and_advantages_exactly(run_dir: Path) -> None:
    before = digest(run_dir / "trajectories.db")
    run = load_run(run_dir)
    result = rescore_run(run, rewards.original, "original")
    assert run.config_source == "store meta" and run.config.core.group_size == 2
    assert [s.step for s in result.steps] == list(range(STEPS)) and result.reproduced
    with SQLiteStore(run_dir / "trajectories.db", read_only=True) as store:
        for step in result.steps:
            stored = {r.id: r for r in store.rollouts(step=step.step)}
            batch = [r for g in run.steps[step.step].groups for r in g.finished]  # batch order: groups by index
            assert len(stored) == 4 and sorted(r.id for r in batch) == sorted(stored) and not step.changes
            assert step.rescored.rewards == step.original.rewards == tuple(stored[r.id].total_reward for r in batch)
            logged = {name: value for s, name, value in store.metric_history() if s == step.step}
            for name in (*REPRODUCED, "rollout/metrics/answered"):  # the loop's own figures, bit for bit
                assert step.original.metrics[name] == step.rescored.metrics[name] == logged[name], name
            assert step.original.tokens_trained == step.rescored.tokens_trained == logged["train/tokens_trained"] > 0
            assert step.rescored.trained_ids == {i for i in stored if store.trained_step(i) == step.step}
            # every group has one success: every trained token carries an advantage of +-1/sqrt(2)
            assert logged["analysis/zero_adv_groups"] == 0.0 and step.rescored.signal_frac == 1.0
            assert step.rescored.abs_adv_per_token == pytest.approx(2 ** -0.5, rel=1e-5)
    assert digest(run_dir / "trajectories.db") == before  # read-only: the store is untouched


def test_a_lenient_reward_flattens_group_b_and_the_strict_scorer_names_its_loophole(run_dir: Path) -> None:
    run = load_run(run_dir)
    result = rescore_run(run, rewards.lenient, "lenient", strict=StrictScorer(agents.strict_answer))
    for step in result.steps:
        o, r = step.original, step.rescored
        assert {c.final_answer for c in step.changes} == {"answer 42"} and len(step.changes) == 1
        assert all((c.original, c.rescored) == (0.0, 1.0) for c in step.changes)
        assert r.metrics["rollout/reward/mean"] == 0.75 and o.metrics["rollout/reward/mean"] == 0.5
        assert (o.metrics["analysis/zero_adv_groups"], r.metrics["analysis/zero_adv_groups"]) == (0.0, 1.0)
        assert r.metrics["analysis/zero_adv_frac"] == 0.5 and r.metrics["samples/count"] == 2.0
        group_a = [g for g in run.steps[step.step].groups if g.task.id == "train-a"][0]
        assert r.trained_ids == {x.id for x in group_a.kept}  # only group a still trains
        assert 0 < r.tokens_signal < o.tokens_signal and r.tokens_generated == o.tokens_generated
        assert r.signal_frac == pytest.approx(r.tokens_signal / o.tokens_generated)
        assert not step.strict_original.disagreements
        assert [(d.kind, d.final_text) for d in step.strict_rescored.disagreements] == [("reward_only", "answer 42")]


def test_another_advantage_method_rescales_the_signal(run_dir: Path) -> None:
    result = rescore_run(load_run(run_dir), rewards.original, "original", method="rloo")
    for step in result.steps:  # rewards (1, 0) per group: RLOO gives +-1 where GRPO gave +-1/sqrt(2)
        assert step.rescored.abs_adv_per_token == 1.0 and step.rescored.metrics["advantages/abs_mean"] == 1.0
        assert step.original.abs_adv_per_token == pytest.approx(2 ** -0.5, rel=1e-5)
    with pytest.raises(ValueError, match=r"--advantage: unknown advantage method 'grpoo'; known: .*rloo"):
        rescore_run(load_run(run_dir), rewards.original, method="grpoo")


def test_the_command_writes_the_report_beside_the_run(run_dir: Path, capsys) -> None:
    assert cli.main(["rescore", str(run_dir), "--reward", spec("lenient"), "--strict",
                     "_eval_agents:strict_answer"]) == 0
    out = capsys.readouterr().out
    assert "step 0: reward 0.500 -> 0.750, zero-advantage groups 0.00 -> 0.50" in out
    folder = run_dir / "rescore-lenient"
    data = json.loads((folder / "rescore_report.json").read_text())
    assert data["reproduced"] is True and data["checked_steps"] == list(range(STEPS))
    assert data["changed_count"] == STEPS and data["strict"]["rescored"]["reward_only_count"] == STEPS
    assert data["strict"]["original"]["reward_only_count"] == 0
    assert data["totals"]["rescored"]["reward/mean"] == 0.75
    markdown = (folder / "rescore_report.md").read_text()
    assert "reproduces what the run logged at steps 0..2" in markdown and "| answer 42 |" in markdown
    assert (folder / "rescore_report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_clear_errors_for_a_bad_spec_a_nan_reward_a_raising_reward_and_a_folder_without_a_store(
    run_dir: Path, tmp_path: Path
) -> None:
    def rescore(*argv: str) -> str:
        with pytest.raises(SystemExit) as raised:
            cli.main(["rescore", *argv])
        return str(raised.value)

    assert "--reward: expected module:function or file.py:function, got 'lenient'" in rescore(
        str(run_dir), "--reward", "lenient")
    assert "has no function 'nope'" in rescore(str(run_dir), "--reward", spec("nope"))
    first = load_run(run_dir).steps[0].rollouts[0].id
    assert f"not_a_number returned nan for rollout {first!r}; expected a finite number" in rescore(
        str(run_dir), "--reward", spec("not_a_number"))
    message = rescore(str(run_dir), "--reward", spec("broken"))
    assert "reward broken raised AttributeError" in message and f"on rollout {first!r} (task 'train-" in message
    (tmp_path / "empty").mkdir()
    assert "holds no trajectory store (trajectories.db)" in rescore(
        str(tmp_path / "empty"), "--reward", spec("lenient"))
    assert "no folder" in rescore(str(tmp_path / "missing"), "--reward", spec("lenient"))
    assert not (tmp_path / "empty" / "trajectories.db").exists()  # nothing created while looking


def test_a_run_without_a_recorded_config_asks_for_the_yaml(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "old-run"
    copy.mkdir()
    shutil.copy(run_dir / "trajectories.db", copy / "trajectories.db")
    with sqlite3.connect(copy / "trajectories.db") as conn:
        recorded = json.loads(conn.execute("SELECT value FROM meta WHERE key = ?", (RUN_CONFIG_META,)).fetchone()[0])
        conn.execute("DELETE FROM meta WHERE key = ?", (RUN_CONFIG_META,))
    with pytest.raises(SystemExit, match=r"records no config .* pass the YAML it trained with \(mtrl rescore RUN"):
        cli.main(["rescore", str(copy), "--reward", spec("original")])
    (copy / "config.yaml").write_text(yaml.safe_dump(recorded))
    assert cli.main(["rescore", str(copy), "--reward", spec("original"), "--config", str(copy / "config.yaml"),
                     "--out", str(tmp_path / "report")]) == 0
    assert json.loads((tmp_path / "report" / "rescore_report.json").read_text())["reproduced"] is True


def test_the_run_store_is_opened_read_only(run_dir: Path) -> None:
    import asyncio

    from mtrl_runtime.rescore import open_run_store

    store = open_run_store(run_dir)
    try:
        rollout = store.rollouts(step=0)[0]
        with pytest.raises(PermissionError, match="open read-only; nothing may be written"):
            store.set_meta("note", 1)
        with pytest.raises(PermissionError, match="open read-only"):
            asyncio.run(store.aset_reward(rollout.id, 0.0))
        assert store.get_rollout(rollout.id).reward == rollout.reward
    finally:
        store.close()


def test_a_step_never_committed_is_rescored_without_a_logged_history_to_check(run_dir: Path, tmp_path: Path) -> None:
    """A step trained after the last checkpoint has no history: its batch is still rebuilt and measured."""
    shutil.copy(run_dir / "trajectories.db", tmp_path / "trajectories.db")
    with sqlite3.connect(tmp_path / "trajectories.db") as conn:
        conn.execute("DELETE FROM metrics WHERE step = ?", (STEPS - 1,))
    full, cut = load_run(run_dir), load_run(tmp_path)
    assert not cut.steps[-1].logged and cut.steps[-1].policy_version == full.steps[-1].policy_version == STEPS - 1
    committed, uncommitted = rescore_run(full, rewards.original), rescore_run(cut, rewards.original)
    assert uncommitted.reproduced and len(uncommitted.mismatches) == 0
    assert uncommitted.steps[-1].original.summary() == committed.steps[-1].original.summary()
    assert uncommitted.steps[-1].original.tokens_trained > 0  # nothing dropped as stale: the version is the rollouts'
