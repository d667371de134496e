"""Roles: a planner and a worker in one agent, each call tagged with its role, each role rewarded and advantaged apart.

A plain OpenAI-SDK agent (as the SDK's docs teach: ``AsyncOpenAI().chat.completions.create``) runs under
``@rollout`` against a real coordinator on loopback (the scripted engine answers by the role the coordinator asked
it for). The planner's call names ``planner-model``, the worker's calls ``worker-model``; ``advanced.policy_models``
maps ``{planner: planner-model, worker: worker-model}``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from _adapter_support import specs, tasks
from _roles_agents import planner_and_worker
from mtrl_adapters import rollout, rollout_scope, update_reward
from mtrl_adapters._values import policy_model_ids
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.roles import RoleMap, RoleSettings, role_view, trained_roles
from mtrl_runtime.rollouts import GroupResult
from mtrl_runtime.store import MemoryStore, SQLiteStore
from mtrl_runtime.training import prepare_role_batch
from mtrl_runtime.types import Rollout, RolloutStatus, Task, Turn

openai = pytest.importorskip("openai")

ROLES = {"planner": "planner-model", "worker": "worker-model"}
CONFIG = {"advanced": {"policy_models": ROLES}}


def role_policy(request: Any, prompt: str) -> ScriptedReply | str:
    """The planner writes a plan; the worker looks the key up, then answers (by the role the coordinator asked)."""
    if request.role == "planner":
        return "PLAN: look the key up, then answer."
    if request.role == "worker":
        if "<tool_response>" not in prompt:
            return ScriptedReply.tool_call("lookup", {"key": "K01"})
        return "The answer is 42. DONE"
    raise AssertionError(f"a call reached the engine with role {request.role!r}")


def two_role_agent(planner_reward: float | None = None) -> Any:
    @rollout
    async def run(task: Task) -> str:
        client = openai.AsyncOpenAI(api_key="sk-user", base_url="https://api.openai.com/v1")
        plan = await client.chat.completions.create(
            model=ROLES["planner"], messages=[{"role": "user", "content": f"Plan: {task.prompt}"}])
        messages: list[dict] = [{"role": "system", "content": plan.choices[0].message.content},
                                {"role": "user", "content": task.prompt}]
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"key": {"type": "string"}}}}}]
        for _ in range(3):
            reply = await client.chat.completions.create(model=ROLES["worker"], messages=messages, tools=tools)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
        roles = None if planner_reward is None else {"planner": planner_reward}
        update_reward(1.0 if "42" in (message.content or "") else 0.0, role_rewards=roles)
        await client.close()
        return message.content or ""

    return run


def _role_specs(handle: Any, n: int) -> list:
    return [dataclasses.replace(s, policy_models=tuple(ROLES.values())) for s in specs(handle, tasks(n))]


async def test_each_call_is_recorded_as_its_roles_turn_with_its_own_segment(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, role_policy), MtrlConfig.from_dict(CONFIG))
    run = two_role_agent(planner_reward=0.25)
    [spec] = _role_specs(handle, 1)
    with rollout_scope(spec):
        answer = await run(spec.task)
    assert "42" in answer
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED
    assert [t.role for t in stored.turns] == ["planner", "worker", "worker"]
    assert stored.turns[0].completion_text.startswith("PLAN")
    # the worker's second call extends its first (one sequence), in a segment the planner's never uses
    assert stored.turns[1].segment == stored.turns[2].segment != stored.turns[0].segment
    assert stored.turns[2].break_reason is None
    assert stored.reward == 1.0 and stored.role_rewards == {"planner": 0.25}
    planner, worker = role_view(stored, "planner"), role_view(stored, "worker")
    assert (planner.reward, [t.index for t in planner.turns]) == (0.25, [0])
    assert (worker.reward, [t.index for t in worker.turns]) == (1.0, [1, 2])


async def test_a_call_naming_no_role_is_refused_naming_the_roles(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, role_policy), MtrlConfig.from_dict(CONFIG))
    [spec] = specs(handle, tasks(1))  # no policy_models on the spec: every call is sent, "policy" included

    @rollout
    async def run(task: Task) -> None:
        client = openai.AsyncOpenAI(api_key="sk-user", base_url="https://api.openai.com/v1")
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])

    with rollout_scope(spec):
        with pytest.raises(openai.BadRequestError, match=r"none of this run's roles.*planner-model"):
            await run(spec.task)
    assert handle.store.get_rollout(spec.rollout_id).turns == ()


async def test_role_rewards_naming_an_unknown_role_are_refused(served, tiny_tok):
    from mtrl_adapters import RolloutError

    handle = served(ScriptedEngine(tiny_tok, role_policy), MtrlConfig.from_dict(CONFIG))
    [spec] = _role_specs(handle, 1)

    @rollout
    async def run(task: Task) -> None:
        client = openai.AsyncOpenAI(api_key="sk-user", base_url="https://api.openai.com/v1")
        await client.chat.completions.create(model=ROLES["planner"], messages=[{"role": "user", "content": "x"}])
        from mtrl_adapters import aupdate_reward
        await aupdate_reward(1.0, role_rewards={"critic": 1.0})

    with rollout_scope(spec):
        with pytest.raises(RolloutError, match=r"role_rewards names the role 'critic'.*'planner', 'worker'"):
            await run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.role_rewards == {} and stored.reward_defaulted  # nothing of the refused report was kept


async def test_per_role_advantages_within_the_group(served, tiny_tok):
    """Four rollouts of one task: the worker's reward varies, the planner's role reward too, independently."""
    handle = served(ScriptedEngine(tiny_tok, role_policy), MtrlConfig.from_dict(CONFIG))
    task = tasks(1)[0]
    rollouts = []
    for planner_reward in (0.0, 1.0, 1.0, 0.0):
        created = handle.coordinator.create_rollout(task, group_id="g0")
        [spec] = [dataclasses.replace(s, rollout_id=created.rollout_id, token=created.token, group_id="g0",
                                      policy_models=tuple(ROLES.values())) for s in specs(handle, [task])]
        with rollout_scope(spec):
            await two_role_agent(planner_reward)(task)
        rollouts.append(handle.store.get_rollout(spec.rollout_id))
    group = GroupResult(id="g0", task=task, kept=tuple(rollouts), finished=tuple(rollouts), dropped=False)
    batches = prepare_role_batch([group], ("planner", "worker"), "group_based", _params(), 0, 0)
    planner, worker = batches["planner"], batches["worker"]
    # the worker's reward is the episode's (1.0 every time): no signal, nothing to train
    assert worker.samples == [] and worker.metrics["analysis/zero_adv_groups"] == 1.0
    # the planner's own rewards differ: its samples carry its role, its tokens only, advantages of its rewards
    assert {s.role for s in planner.samples} == {"planner"} and len(planner.samples) == 4
    signs = [max(s.advantages_T, key=abs) > 0 for s in planner.samples]
    assert signs == [False, True, True, False]
    for sample, rollout_ in zip(planner.samples, rollouts):
        assert sum(sample.loss_mask_T) == len(rollout_.turns[0].completion_ids)


def _params() -> Any:
    from mtrl_runtime.algorithms import AdvantageParams

    return AdvantageParams()


@pytest.mark.parametrize("make", [lambda p: SQLiteStore(p / "s.db"), lambda p: MemoryStore()])
def test_a_turns_role_is_stored(make, tmp_path):
    from mtrl_runtime.store import hash_token

    store = make(tmp_path)
    try:
        store.put_task(Task(id="t1", prompt="p"))
        store.create_rollout(Rollout(id="r1", task_id="t1", group_id="g1", created_at=1.0), hash_token("tok"))
        for index, (role, prompt) in enumerate([("planner", (1, 2)), ("worker", (3, 4))]):
            store.add_turn(Turn(rollout_id="r1", index=index, messages=({"role": "user", "content": "q"},),
                                prompt_ids=prompt, completion_ids=(7, 8), logprobs=(-0.5, -0.25),
                                finish_reason="stop", completion_text="a", segment=index, role=role))
        assert [t.role for t in store.get_rollout("r1").turns] == ["planner", "worker"]
        with pytest.raises(ValueError, match="turn.role"):
            store.add_turn(Turn(rollout_id="r1", index=2, messages=(), prompt_ids=(1,), completion_ids=(2,),
                                logprobs=(-1.0,), finish_reason="stop", completion_text="", role=3))  # type: ignore
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def test_config_names_the_field_and_value():
    config = MtrlConfig.from_dict({"advanced": {"policy_models": ROLES,
                                                "roles": {"schedule": "alternating", "phase_steps": 2}}})
    assert config.advanced.role_map == RoleMap((("planner", "planner-model"), ("worker", "worker-model")))
    assert config.advanced.policy_model_ids == ("planner-model", "worker-model")
    bad = [
        ({"policy_models": {"planner": "m", "worker": "m"}}, r"policy_models\.worker: model id 'm' is already"),
        ({"policy_models": {"2nd": "m"}}, r"role name '2nd'"),
        ({"policy_models": {"planner": ""}}, r"policy_models\.planner must be a non-empty model id"),
        ({"policy_models": {"planner": "m"}, "roles": {"schedule": "alternating"}}, r"names one role \('planner'\)"),
        ({"policy_models": ["m"], "roles": {"schedule": "alternating"}}, r"advanced\.roles: .* not a mapping"),
        ({"policy_models": ROLES, "roles": {"schedule": "round_robin"}}, r"advanced\.roles\.schedule"),
        ({"policy_models": ROLES, "roles": {"phase_steps": 0}}, r"advanced\.roles\.phase_steps"),
        ({"policy_models": ROLES, "full_finetune": True}, r"one LoRA adapter each"),
    ]
    for advanced, message in bad:
        with pytest.raises(ConfigError, match=message):
            MtrlConfig.from_dict({"advanced": advanced})
    assert policy_model_ids(ROLES) == frozenset(ROLES.values())  # @rollout(policy_models={...}) captures both


def test_schedules():
    joint, alternating = RoleSettings(), RoleSettings(schedule="alternating", phase_steps=2)
    assert [trained_roles(("a", "b"), joint, s) for s in range(2)] == [("a", "b")] * 2
    assert [trained_roles(("a", "b"), alternating, s) for s in range(5)] == [("a",), ("a",), ("b",), ("b",), ("a",)]


def test_bad_role_rewards_are_refused_before_sending():
    from mtrl_adapters._values import reward_report

    with pytest.raises(TypeError, match=r"role_rewards\['planner'\] must be a float"):
        reward_report(1.0, None, {"planner": "high"})
    with pytest.raises(ValueError, match="role_rewards is empty"):
        reward_report(1.0, None, {})
    with pytest.raises(ValueError, match=r"role_rewards\['planner'\]"):
        reward_report(1.0, None, {"planner": float("nan")})
    assert reward_report(1.0, None, {"planner": 0.5}).role_rewards == {"planner": 0.5}
    assert json.loads(reward_report(1.0, None).model_dump_json())["role_rewards"] is None


# ---------------------------------------------------------------- training through the trainer (hf engine)
TRAIN = [{"id": f"t{i}", "prompt": f"inspect aircraft N{i}0"} for i in range(2)]


def _check_mlflow(result: Any) -> None:
    """MLflow holds each role's figures at every step, and each LLM span names its role."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(result.tracking_uri)
    for name in ("role/planner/train/tokens_trained", "role/worker/train/tokens_trained",
                 "role/planner/rollout/reward/mean", "role/worker/rollout/reward/mean",
                 "rollout/metrics/role_reward/planner"):
        assert [m.step for m in client.get_metric_history(result.mlflow_run_id, name)] == [0, 1], name
    run = client.get_run(result.mlflow_run_id)
    mlflow.set_tracking_uri(result.tracking_uri)
    traces = mlflow.search_traces(locations=[run.info.experiment_id], return_type="list", flush=True)
    assert len(traces) == 16
    for trace in traces:
        llm = sorted((s for s in trace.data.spans if s.name.startswith("llm turn")), key=lambda s: s.name)
        assert [s.attributes["mtrl.role"] for s in llm] == ["planner", "worker"]


def test_training_steps_train_each_roles_adapter_on_its_own_calls(tmp_path, tiny_model_dir):
    """Two steps of the real trainer, hf engine on the tiny model: every call is its role's turn, each role's
    adapter leaves its initialisation, MLflow's metric store holds each role's figures, the run's adapter folder
    holds one adapter per role."""
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    config = MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "model": str(tiny_model_dir), "engine": "hf", "group_size": 4,
                 "train_batch_size": 2, "max_steps": 2, "val_every": 0, "max_turns": 2, "lora_rank": 4,
                 "lora_alpha": 8, "learning_rate": 1e-2, "sampling_params": {"max_tokens": 8}},
        "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 60, "policy_models": ROLES,
                     "chat_format": "hermes"},
    })
    trainer = MultiTurnRLTrainer(agent_env=planner_and_worker, training_dataset=TRAIN, config=config)
    result = trainer.train(progress=False)
    assert result.final_step == 2
    _check_mlflow(result)
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        rollouts = [r for r in store.rollouts() if r.step is not None]
        assert len(rollouts) == 16
        for r in rollouts:
            assert [t.role for t in r.turns] == ["planner", "worker"], r.error
            assert set(r.role_rewards) == {"planner"}
        history = {name for name in ("role/planner/train/tokens_trained", "role/worker/train/tokens_trained",
                                     "role/planner/rollout/reward/mean", "role/worker/analysis/zero_adv_groups")
                   if store.metric_history(name)}
        assert len(history) == 4
        trained = {role: sum(v for _, _, v in store.metric_history(f"role/{role}/train/tokens_trained"))
                   for role in ROLES}
        assert trained["planner"] > 0 and trained["worker"] > 0
    finally:
        store.close()
    from safetensors.torch import load_file

    for role in ROLES:  # B starts at zero: a trained adapter's B is not
        [weights] = sorted((result.output_adapter_path / role).rglob("adapter_model.safetensors"))
        lora_B = [t for name, t in load_file(str(weights)).items() if "lora_B" in name]
        assert lora_B and any(bool(t.abs().sum() > 0) for t in lora_B), role


def test_dynamic_sampling_counts_a_group_useful_when_some_role_has_signal():
    """Equal episode rewards but different planner rewards: no signal for one policy, signal for the planner."""
    from mtrl_runtime.training import useful_mask

    task = Task(id="t", prompt="p")
    turns = (Turn(rollout_id="r", index=0, messages=(), prompt_ids=(1,), completion_ids=(2,), logprobs=(-1.0,),
                  finish_reason="stop", completion_text="plan", role="planner"),)
    kept = tuple(Rollout(id=f"r{i}", task_id="t", group_id="g", status=RolloutStatus.COMPLETED, reward=1.0,
                         turns=turns, metrics={"role_reward/planner": float(i % 2)}) for i in range(4))
    group = GroupResult(id="g", task=task, kept=kept, finished=kept, dropped=False)
    assert useful_mask([group], MtrlConfig()) == [False]
    assert useful_mask([group], MtrlConfig.from_dict(CONFIG)) == [True]
