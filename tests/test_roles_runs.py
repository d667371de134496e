"""A run with roles through the commands that read its folder: ``mtrl train --resume``, ``mtrl eval``, ``mtrl rescore``.

One real two-step run (hf engine on the tiny model, the two-role agent of ``_roles_agents``: each role rewarded by
one of seven levels of what it wrote, so every group carries signal for every role) is trained by ``mtrl train``
with a checkpoint after each step; each test works on its own copy of the folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from _roles_agents import ROLES, seven_levels
from mtrl_runtime import cli
from mtrl_runtime.run_folder import RunFolder
from mtrl_runtime.store import SQLiteStore

pytest.importorskip("openai")
pytest.importorskip("peft")

TESTS = Path(__file__).parent
AGENTS = TESTS / "_roles_agents.py"
AGENT = f"{AGENTS}:spread_planner_and_worker"
TRAIN = [{"id": f"t{i}", "prompt": f"inspect aircraft N{i}0"} for i in range(2)]
STEPS = 2


def _config(folder: Path, model: Path, **advanced: Any) -> Path:
    """A roles run's YAML in ``folder`` (run folder ``folder/run``), its tasks beside it."""
    data = folder / "tasks.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in TRAIN))
    config = {
        "core": {"run_dir": str(folder / "run"), "model": str(model), "engine": "hf", "dataset": str(data),
                 "group_size": 4, "train_batch_size": 2, "max_steps": STEPS, "val_every": 0, "max_turns": 2,
                 "lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-2, "pass_k_values": [1, 2],
                 "sampling_params": {"max_tokens": 8}, "val_sampling_params": {"temperature": 1.0, "max_tokens": 8}},
        "advanced": {"checkpoint_every": 1, "rollout_timeout_s": 60, "policy_models": ROLES, "chat_format": "hermes",
                     "engine_options": {"num_threads": 1, "dtype": "fp32"}, **advanced},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> Path:
    """The folder holding the two-step roles run (``run/``), its config and tasks."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("roles-run")
    assert cli.main(["train", str(_config(folder, tiny_model_dir)), "--agent", AGENT, "--no-mlflow"]) == 0
    return folder


@pytest.fixture
def run_copy(trained, tmp_path, tiny_model_dir) -> Path:
    """A copy of the trained folder in ``tmp_path`` (its config pointing at the copy)."""
    shutil.copytree(trained / "run", tmp_path / "run")
    _config(tmp_path, tiny_model_dir)
    return tmp_path


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    [weights] = sorted(folder.rglob("adapter_model.safetensors"))
    return load_file(str(weights))


def _checkpoint(run: Path, step: int) -> Path:
    """The policy part of the checkpoint written before ``step`` (``training._checkpoint``)."""
    return run / "checkpoints" / f"step-{step:06d}" / "policy"


def _weights(run: Path, step: int) -> Path:
    return _checkpoint(run, step) / "weights"


def _state(run: Path, step: int) -> dict[str, Any]:
    return torch.load(_checkpoint(run, step) / "trainer_state.pt", weights_only=True)


def _adam_steps(optimizer_state: dict[str, Any]) -> set[int]:
    return {int(s["step"]) for s in optimizer_state["state"].values()}


# ---------------------------------------------------------------- mtrl train --resume
def test_resume_restores_each_roles_adapter_and_optimizer_and_trains_every_role_on(run_copy):
    run = run_copy / "run"
    config = run_copy / "config.yaml"
    saved = _state(run, STEPS)
    assert saved["versions"] == {role: STEPS for role in ROLES}
    for role in ROLES:
        assert _adam_steps(saved["optimizers"][role]) == {STEPS}, role

    # resumed at its end: nothing trains, and the final adapters written are the checkpoint's, restored
    shutil.rmtree(run / "adapter")
    assert cli.main(["train", str(config), "--agent", AGENT, "--no-mlflow", "--resume"]) == 0
    for role in ROLES:
        restored, checkpoint = _adapter(run / "adapter" / role), _adapter(_weights(run, STEPS) / role)
        assert restored.keys() == checkpoint.keys() and restored
        for name, tensor in checkpoint.items():
            assert torch.equal(restored[name], tensor), (role, name)
        assert any(bool(t.abs().sum() > 0) for n, t in restored.items() if "lora_B" in n), role  # trained, not init

    # one more step: each role's optimizer goes on from its own state (AdamW's step count 3, not 1)
    assert cli.main(["train", str(config), "--agent", AGENT, "--no-mlflow", "--resume",
                     "--max-steps", str(STEPS + 1)]) == 0
    after = _state(run, STEPS + 1)
    assert after["versions"] == {role: STEPS + 1 for role in ROLES}
    for role in ROLES:
        assert _adam_steps(after["optimizers"][role]) == {STEPS + 1}, role
        before, now = _adapter(_weights(run, STEPS) / role), _adapter(_weights(run, STEPS + 1) / role)
        assert any(not torch.equal(before[n], now[n]) for n in before), role  # the step moved it
    with SQLiteStore(run / "trajectories.db", read_only=True) as store:
        resumed = [r for r in store.rollouts(step=STEPS)]
        assert len(resumed) == 8
        for r in resumed:
            assert [t.role for t in r.turns] == ["planner", "worker"], r.error
            assert store.trained_step(r.id) == STEPS
        for role in ROLES:
            history = {step: value for step, _, value in store.metric_history(f"role/{role}/train/tokens_trained")}
            assert sorted(history) == list(range(STEPS + 1)) and history[STEPS] > 0, role
        [record] = store.get_meta("resumes")[-1:]
        assert record["start_step"] == STEPS


def test_resume_with_other_roles_is_refused_naming_the_missing_role(run_copy, tiny_model_dir):
    config = _config(run_copy, tiny_model_dir, policy_models={"planner": "planner-model", "critic": "critic-model"})
    with pytest.raises(ValueError, match=r"holds no state for the roles \['critic'\].*advanced\.policy_models"):
        cli.main(["train", str(config), "--agent", AGENT, "--no-mlflow", "--resume"])


# ---------------------------------------------------------------- mtrl eval
def _teacher_forced(model: Any, turn: Any) -> torch.Tensor:
    """The log-probabilities ``model`` gives the turn's completion tokens after its prompt."""
    ids = torch.tensor([list(turn.prompt_ids) + list(turn.completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    n = len(turn.prompt_ids)
    logprobs = torch.log_softmax(logits[n - 1:-1], dim=-1)
    return logprobs.gather(1, torch.tensor(turn.completion_ids).unsqueeze(1)).squeeze(1)


def test_eval_serves_each_roles_calls_with_its_own_adapter(run_copy):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run, out = run_copy / "run", run_copy / "eval"
    assert cli.main(["eval", str(run_copy / "config.yaml"), "--agent", AGENT, "--dataset",
                     str(run_copy / "tasks.jsonl"), "--no-mlflow", "--output", str(out)]) == 0
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
        json.loads((run / "adapter" / "planner" / "adapter_config.json").read_text())["base_model_name_or_path"],
        torch_dtype=torch.float32), str(run / "adapter" / "planner"), adapter_name="planner").eval()
    model.load_adapter(str(run / "adapter" / "worker"), adapter_name="worker")
    with SQLiteStore(RunFolder(out).store, read_only=True) as store:
        rollouts = store.rollouts()
    assert len(rollouts) == 2 * len(TRAIN)  # k = max(pass_k_values) samples per task, fine-tuned side only
    for rollout in rollouts:
        assert [t.role for t in rollout.turns] == ["planner", "worker"], rollout.error
        for turn in rollout.turns:
            served = torch.tensor(turn.logprobs)
            by_adapter = {}
            for role in ROLES:
                model.set_adapter(role)
                by_adapter[role] = float((_teacher_forced(model, turn) - served).abs().max())
            other = next(r for r in ROLES if r != turn.role)
            assert by_adapter[turn.role] < 1e-3, (turn.role, by_adapter)
            assert by_adapter[other] > 10 * max(by_adapter[turn.role], 1e-4), (turn.role, by_adapter)


def test_eval_of_a_roles_run_missing_a_roles_adapter_names_it(run_copy):
    shutil.rmtree(run_copy / "run" / "adapter" / "worker")
    with pytest.raises(FileNotFoundError, match=r"worker.*adapter_config\.json"):
        cli.main(["eval", str(run_copy / "config.yaml"), "--agent", AGENT, "--dataset", str(run_copy / "tasks.jsonl"),
                  "--no-mlflow", "--output", str(run_copy / "eval")])


# ---------------------------------------------------------------- mtrl rescore
def test_rescore_reproduces_a_roles_run_and_keeps_each_roles_own_reward(trained):
    from mtrl_runtime.rescore import load_run, rescore_run

    import _roles_agents as agents

    run = load_run(trained / "run")
    original = rescore_run(run, agents.episode_reward, "episode")
    assert [s.step for s in original.steps] == list(range(STEPS))
    assert original.reproduced, original.mismatches
    with SQLiteStore(trained / "run" / "trajectories.db", read_only=True) as store:
        for step in original.steps:
            assert not step.changes  # the agent's own reward, read off the trajectory
            logged = {name: value for s, name, value in store.metric_history() if s == step.step}
            for role in ROLES:
                name = f"role/{role}/rollout/reward/mean"
                assert step.rescored.metrics[name] == pytest.approx(logged[name], rel=1e-9), name
    # one reward for every episode: the worker's signal is gone; the planner keeps its own reward, and its tokens
    flat = rescore_run(run, agents.flat_reward, "flat")
    for step in flat.steps:
        metrics = step.rescored.metrics
        assert metrics["role/worker/samples/count"] == 0 and metrics["role/planner/samples/count"] == 8
        assert metrics["role/planner/rollout/reward/mean"] == step.original.metrics["role/planner/rollout/reward/mean"]
        assert 0 < step.rescored.tokens_trained < step.original.tokens_trained


def test_rescore_command_on_a_roles_run(trained, tmp_path):
    shutil.copytree(trained / "run", tmp_path / "run")
    assert cli.main(["rescore", str(tmp_path / "run"), "--reward", f"{AGENTS}:flat_reward"]) == 0
    data = json.loads((tmp_path / "run" / "rescore-flat_reward" / "rescore_report.json").read_text())
    assert data["reproduced"] is True and data["checked_steps"] == list(range(STEPS))


def test_seven_levels_spread():
    """The agent's reward really varies: a group of four ties for a role once in 343 (every role trains)."""
    levels = {seven_levels(f"text {i}") for i in range(200)}
    assert len(levels) == 7


def test_eval_base_of_a_roles_run_runs_the_base_model_for_every_role_beside_each_roles_adapter(run_copy):
    """``mtrl eval --base`` on a run with roles: the fine-tuned side serves each role's calls with its adapter, the
    base side every call with no adapter; each side's rollouts keep their roles."""
    from transformers import AutoModelForCausalLM

    run, out = run_copy / "run", run_copy / "eval"
    assert cli.main(["eval", str(run_copy / "config.yaml"), "--agent", AGENT, "--dataset",
                     str(run_copy / "tasks.jsonl"), "--no-mlflow", "--output", str(out), "--base"]) == 0
    base = AutoModelForCausalLM.from_pretrained(
        json.loads((run / "adapter" / "planner" / "adapter_config.json").read_text())["base_model_name_or_path"],
        torch_dtype=torch.float32).eval()
    with SQLiteStore(RunFolder(out).store, read_only=True) as store:
        rollouts = store.rollouts()
    assert len(rollouts) == 2 * 2 * len(TRAIN)  # k samples per task, fine-tuned and base
    base_side = [r for r in rollouts if "-base" in (r.group_id or "")]
    assert len(base_side) == 2 * len(TRAIN), [r.group_id for r in rollouts]
    for rollout in rollouts:
        assert [t.role for t in rollout.turns] == ["planner", "worker"], rollout.error
    for rollout in base_side:
        for turn in rollout.turns:
            gap = float((_teacher_forced(base, turn) - torch.tensor(turn.logprobs)).abs().max())
            assert gap < 1e-3, (turn.role, gap)


def test_eval_of_a_roles_config_not_trained_yet_runs_the_base_model_for_every_role(run_copy, capsys):
    """Before training (no role's adapter in the run folder), ``mtrl eval`` measures the base model the run starts
    from, every role's calls answered by it, the turns keeping their roles (it stopped at load before, naming the
    first role's missing folder)."""
    from transformers import AutoModelForCausalLM

    run, out = run_copy / "run", run_copy / "eval"
    base_path = json.loads((run / "adapter" / "planner" / "adapter_config.json").read_text())["base_model_name_or_path"]
    shutil.rmtree(run / "adapter")
    assert cli.main(["eval", str(run_copy / "config.yaml"), "--agent", AGENT, "--dataset",
                     str(run_copy / "tasks.jsonl"), "--no-mlflow", "--output", str(out), "--base"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["metric", "base"], printed  # one side, the base model's
    base = AutoModelForCausalLM.from_pretrained(base_path, torch_dtype=torch.float32).eval()
    with SQLiteStore(RunFolder(out).store, read_only=True) as store:
        rollouts = store.rollouts()
    assert len(rollouts) == 2 * len(TRAIN) and all("-base" in r.group_id for r in rollouts)  # one side: the base
    for rollout in rollouts:
        assert rollout.status.value == "completed", rollout.error
        assert [t.role for t in rollout.turns] == ["planner", "worker"], rollout.error
        for turn in rollout.turns:
            gap = float((_teacher_forced(base, turn) - torch.tensor(turn.logprobs)).abs().max())
            assert gap < 1e-3, (turn.role, gap)


FAILING_AGENT = """
from mtrl_adapters import rollout


@rollout
async def unreachable_tool(task):
    raise ConnectionError(f"the inspection database is down ({task.id})")
"""


def test_eval_that_completes_no_rollout_exits_1_naming_the_side_and_its_first_error(run_copy, capsys):
    """Every rollout fails (the agent's own tool is down): the command says so and exits 1 instead of passing on a
    table of zeros as a result; the report is still written."""
    agent = run_copy / "failing_agent.py"
    agent.write_text(FAILING_AGENT)
    out = run_copy / "eval"
    assert cli.main(["eval", str(run_copy / "config.yaml"), "--agent", f"{agent}:unreachable_tool", "--dataset",
                     str(run_copy / "tasks.jsonl"), "--no-mlflow", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "mtrl eval: no rollout of the fine_tuned side completed (4 ended failed); the first error: ConnectionError: " in err, err
    assert "the inspection database is down (t0)" in err or "the inspection database is down (t1)" in err, err
    assert (out / "report" / "eval_report.md").is_file()
