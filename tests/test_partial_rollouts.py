"""Partial rollouts: a turn in flight when a new policy version is published continues under the new weights,
each token keeps the version that produced it (engine → store → samples), and the loss corrects the older
ones. Without them, the update waits until the turns in flight have ended. Real hf engine on the tiny model
(hidden 64, 2 layers; the byte-level BPE tokenizer trained in the test session), real training steps."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import openai
import pytest
import torch

from mtrl_adapters import aupdate_reward, rollout
from mtrl_runtime.algorithms import build_samples
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.engines import HFEngine
from mtrl_runtime.rollouts import TaskSchedule
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.testing import tiny_model
from mtrl_runtime.training import MultiTurnRLTrainer
from mtrl_runtime.types import GenerationRequest, SamplingParams, Task

LONG = 64  # tokens of every turn (no eos): step 1's are still decoding when step 0's update lands


def _request(tok: Any, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(prompt_ids=tuple(tok.encode("What is the value for key A1?")),
                             sampling=SamplingParams(max_tokens=max_tokens, seed=3))


def _nudge(engine: HFEngine, version: int) -> None:
    """New weights and a new version, as a trainer sharing the model publishes them (on the worker, locked)."""
    with engine.weights_lock, torch.no_grad():
        engine.model.lm_head.weight.mul_(1.5)
        engine.set_policy_version(version)


async def test_a_turn_in_flight_continues_under_the_new_weights_each_token_labelled(tiny_tok: Any) -> None:
    engine = HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok, eos_token_ids=())
    try:
        running = asyncio.ensure_future(engine.generate(_request(tiny_tok, 60)))
        while engine.stats.decode_passes < 5:
            await asyncio.sleep(0.001)
        await engine.on_worker(lambda: _nudge(engine, 1))
        gen = await running
    finally:
        await engine.close()
    versions = gen.token_versions
    assert gen.policy_version == 0 and versions is not None and len(versions) == len(gen.completion_ids) == 60
    switch = versions.index(1)
    assert 5 <= switch < 60 and set(versions[:switch]) == {0} and set(versions[switch:]) == {1}


async def test_a_draining_update_waits_for_the_turn_in_flight_and_holds_new_ones(tiny_tok: Any) -> None:
    engine = HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok, eos_token_ids=())
    try:
        running = asyncio.ensure_future(engine.generate(_request(tiny_tok, 60)))
        while engine.stats.decode_passes < 5:
            await asyncio.sleep(0.001)
        seen: dict[str, Any] = {}

        def update() -> None:
            seen["running_done"] = running.done() or engine.stats.generations == 1
            _nudge(engine, 1)

        drained = asyncio.ensure_future(engine.on_worker(update, drain=True))
        await asyncio.sleep(0.01)
        later = asyncio.ensure_future(engine.generate(_request(tiny_tok, 4)))  # queued behind the update
        first, _, second = await asyncio.gather(running, drained, later)
    finally:
        await engine.close()
    assert seen["running_done"]  # the update ran only once the turn in flight had ended
    assert first.token_versions is None and first.policy_version == 0 and len(first.completion_ids) == 60
    assert second.policy_version == 1 and second.token_versions is None  # admitted only after the update


def _config(run_dir: Any, partial: bool) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"run_dir": str(run_dir), "group_size": 2, "train_batch_size": 1, "max_steps": 2,
                 "learning_rate": 1e-3, "max_turns": 1, "sampling_params": {"max_tokens": LONG}},
        "advanced": {"full_finetune": True, "checkpoint_every": 0, "max_concurrency": 16, "rollout_timeout_s": 120,
                     "async_config": {"enabled": True, "max_steps_off_policy": 1, "partial_rollouts": partial}},
    })


def _train(run_dir: Any, tok: Any, partial: bool) -> tuple[Any, list[Any]]:
    """Two async steps (bound 1), the order of events pinned by the agent: step 1's rollouts call the model once
    step 0's calls have returned, and step 0's rollouts end (so step 0 trains) only once the engine has run 8
    decode passes over step 1's turns: the update lands while they are in flight."""
    config = _config(run_dir, partial)
    tasks = [{"id": "a", "prompt": "What is the value for key A1?"}, {"id": "b", "prompt": "The answer is"}]
    first = TaskSchedule.of([Task(id=t["id"], prompt=t["prompt"]) for t in tasks], 1, config.core.seed).batch(0)[0]
    client = openai.AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)
    engine = HFEngine.from_objects(tiny_model(tok), tok, eos_token_ids=())
    answered: list[int] = []  # step 0's calls that returned
    counts = {t["id"]: itertools.count() for t in tasks}  # rewards 0, 1 within each group: every group has signal

    @rollout
    async def agent(task: Task) -> None:
        step0 = task.id == first.id
        while not step0 and len(answered) < config.core.group_size:
            await asyncio.sleep(0.005)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        if step0:
            answered.append(1)
            while len(answered) < config.core.group_size:
                await asyncio.sleep(0.005)
            passes = engine.stats.decode_passes  # from here on only step 1's rows decode
            while engine.stats.decode_passes < passes + 8:
                await asyncio.sleep(0.005)
        await aupdate_reward(float(next(counts[task.id]) % 2))

    result = MultiTurnRLTrainer(agent_env=agent, training_dataset=tasks, config=config, engine=engine,
                                tracking=False).train(progress=False)
    store = SQLiteStore(run_dir / "trajectories.db")
    try:
        rollouts = list(store.rollouts(step=1))
    finally:
        store.close()
    return result, rollouts


def test_partial_rollouts_store_each_tokens_version_and_the_loss_corrects_the_older_ones(tmp_path, tiny_tok):
    result, rollouts = _train(tmp_path / "run", tiny_tok, partial=True)
    spanning = [t for r in rollouts for t in r.turns if t.token_versions is not None]
    assert spanning, "no turn of step 1 was in flight when step 0's version was published"
    for turn in spanning:  # read back from SQLite: the first tokens version 0, the rest version 1
        switch = turn.token_versions.index(1)
        assert turn.policy_version == 0 and 8 <= switch < LONG
        assert set(turn.token_versions[:switch]) == {0} and set(turn.token_versions[switch:]) == {1}
    rollout_ = next(r for r in rollouts if any(t.token_versions for t in r.turns))
    (sample,) = build_samples(rollout_, [1.0] * len(rollout_.turns))
    assert {v for v in sample.policy_version_T if v >= 0} == {0, 1}  # the sample carries them to the loss
    step1 = result.reports[1].metrics
    assert step1["async/policy_version"] == 1 and step1["async/partial_turns"] == len(spanning)
    assert step1["async/token_lag/1"] > 0  # the version-0 tokens the update saw, one version behind
    # the loss (truncated_is, the default with partial rollouts) weighed exactly those tokens
    assert 0 < step1["train/stale_token_fraction"] < 1 and step1["train/stale_weight_mean"] > 0


def test_without_partial_rollouts_the_update_waits_for_the_turns_in_flight(tmp_path, tiny_tok):
    result, rollouts = _train(tmp_path / "run", tiny_tok, partial=False)
    turns = [t for r in rollouts for t in r.turns]
    assert turns and all(t.token_versions is None and t.policy_version == 0 for t in turns)  # one version each
    step0, step1 = (r.metrics for r in result.reports)
    assert step1["async/partial_turns"] == 0 and step1["async/token_lag/1"] == len(turns) * LONG
    # every token step 1 trains is one version behind: the default correction (none) leaves them to the loss
    assert step0["time/update_wait"] > 0 and step1["train/stale_token_fraction"] == 1.0
    assert "train/stale_weight_mean" not in step1


def test_the_correction_and_partial_rollouts_are_checked_at_load(tmp_path) -> None:
    def load(async_config: dict, core: dict | None = None) -> MtrlConfig:
        return MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path), **(core or {})},
                                     "advanced": {"async_config": async_config}})

    with pytest.raises(ConfigError, match=r"advanced.async_config.stale_correction: .*'clip'; known: masked_is, "
                                          r"none, truncated_is"):
        load({"enabled": True, "stale_correction": "clip"})
    with pytest.raises(ConfigError, match="partial_rollouts: true needs enabled: true"):
        load({"partial_rollouts": True})
    with pytest.raises(ConfigError, match="partial_rollouts: true with core.engine: 'vllm' is not supported"):
        load({"enabled": True, "partial_rollouts": True}, {"engine": "vllm", "model": "m"})
    assert load({"enabled": True, "partial_rollouts": True}).advanced.async_config.correction == "truncated_is"
    assert load({"enabled": True}).advanced.async_config.correction == "none"
