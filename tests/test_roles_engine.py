"""Roles on the hf engine: one model holds a LoRA adapter per role; rows of different roles decode in one batch
(``GenerationRequest.role``) and each row gets exactly what its adapter alone, served by itself, gives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from mtrl_runtime.engines import HFEngine
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.types import GenerationRequest, SamplingParams, ServesRoles

SYSTEM = "system prompt for the inspection agent: plan the inspection, then call the tools in order. " * 2
ROLES = ("planner", "worker")


def with_roles(tok: Any, active: str = "planner") -> Any:
    """The tiny model with two random, non-zero LoRA adapters named by role (k/v too: the KV differs)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=32, init_lora_weights=False,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"])
    torch.manual_seed(3)
    model = get_peft_model(tiny_model(tok), config, adapter_name="planner")
    torch.manual_seed(4)
    model.add_adapter("worker", config)
    model.set_adapter(active)
    return model.eval()


async def two_turns(engine: HFEngine, tok: Any, prompts: list[tuple[int, ...]], roles: list[str | None],
                    base: list[bool] | None = None) -> list[list]:
    """Greedy two-turn generations (turn 2 extends turn 1: prefix cache hits), all rows at once."""
    base = base or [False] * len(prompts)
    out = []
    for _ in range(2):
        gens = await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(
            temperature=0.0, max_tokens=12 + 3 * i, seed=i), role=r, base_model=b))
            for i, (p, r, b) in enumerate(zip(prompts, roles, base))))
        out.append(gens)
        prompts = [p + g.completion_ids + tuple(tok.encode(" next")) for p, g in zip(prompts, gens)]
    return out


@pytest.mark.parametrize("share_prefix", [True, False], ids=["shared-prefix", "own-copies"])
def test_rows_of_different_roles_decode_together_as_each_adapter_alone(share_prefix):
    tok = tiny_tokenizer()
    prompts = [tuple(tok.encode(SYSTEM + f"aircraft {i}" + " check" * i)) for i in range(6)]
    roles = [ROLES[i % 2] for i in range(6)]  # rows alternate: planner, worker, planner, ...

    async def run() -> tuple[list, dict, Any]:
        # the served (folded) adapter is the worker's: the planner's rows switch to theirs inside the batch
        mixed = HFEngine.from_objects(with_roles(tok, active="worker"), tok, eos_token_ids=(), max_batch_size=6,
                                      share_prefix=share_prefix)
        alone = {role: HFEngine.from_objects(with_roles(tok, active=role), tok, eos_token_ids=(), share_prefix=False)
                 for role in ROLES}
        try:
            assert isinstance(mixed, ServesRoles) and mixed.serves_roles() == frozenset(ROLES)
            got = await two_turns(mixed, tok, prompts, roles)
            want = {role: await two_turns(engine, tok, prompts, [None] * 6) for role, engine in alone.items()}
            return got, want, mixed.stats
        finally:
            await mixed.close()
            for engine in alone.values():
                await engine.close()

    got, want, stats = asyncio.run(run())
    for turn in range(2):
        for i, role in enumerate(roles):
            assert got[turn][i].completion_ids == want[role][turn][i].completion_ids, (turn, i, role)
            assert got[turn][i].logprobs == pytest.approx(want[role][turn][i].logprobs, abs=1e-4)
    # the two roles' adapters really differ: the test would not notice a row served with the wrong one otherwise
    assert any(want["planner"][0][i].completion_ids != want["worker"][0][i].completion_ids for i in range(6))
    assert stats.max_rows == 6  # the rows of both roles decoded in the same passes


def test_a_role_with_no_adapter_is_refused_naming_it():
    tok = tiny_tokenizer()

    async def run() -> None:
        engine = HFEngine.from_objects(with_roles(tok), tok, eos_token_ids=())
        try:
            with pytest.raises(ValueError, match=r"role: 'critic' names no LoRA adapter.*'planner', 'worker'"):
                await engine.generate(GenerationRequest(tuple(tok.encode("hi")), SamplingParams(max_tokens=2),
                                                        role="critic"))
        finally:
            await engine.close()
        plain = HFEngine.from_objects(tiny_model(tok), tok, eos_token_ids=())
        try:
            assert plain.serves_roles() == frozenset()
            with pytest.raises(ValueError, match=r"role: 'planner' names no LoRA adapter"):
                await plain.generate(GenerationRequest(tuple(tok.encode("hi")), SamplingParams(max_tokens=2),
                                                       role="planner"))
        finally:
            await plain.close()

    asyncio.run(run())


def _sample(role: str, tok: Any, text: str, advantage: float) -> Any:
    from mtrl_runtime.types import Sample

    prompt, completion = tuple(tok.encode("question: " + text)), tuple(tok.encode(" answer " + text))
    n, c = len(prompt), len(completion)
    return Sample(rollout_id=f"r-{role}-{text}", group_id="g", segment=0, token_ids_T=prompt + completion,
                  loss_mask_T=(0,) * n + (1,) * c, behaviour_logprobs_T=(0.0,) * n + (-2.0,) * c,
                  advantages_T=(0.0,) * n + (advantage,) * c, policy_version_T=(-1,) * n + (0,) * c, role=role)


def _adapter_weights(model: Any, role: str) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if f".{role}." in name}


def test_each_roles_adapter_changes_only_from_its_own_tokens(tmp_path):
    """Real AdamW steps on the tiny model: a step of the planner's samples moves the planner's adapter and leaves
    the worker's bit for bit; a joint step moves both; an alternating schedule's frozen role stays."""
    from mtrl_runtime.roles import RoleSettings, trained_roles
    from mtrl_runtime.training import RoleUpdates, UpdateSettings, build_policy

    tok = tiny_tokenizer()
    policy = build_policy(tiny_model(tok), tok, rank=4, alpha=8, device="cpu")
    updates = RoleUpdates(policy, ROLES, UpdateSettings(learning_rate=1e-2))
    model = policy.model
    assert set(model.peft_config) == set(ROLES)
    planner_samples = [_sample("planner", tok, f"plan {i}", 1.0 - 2 * (i % 2)) for i in range(2)]
    worker_samples = [_sample("worker", tok, f"work {i}", 1.0 - 2 * (i % 2)) for i in range(2)]

    before = {role: _adapter_weights(model, role) for role in ROLES}
    metrics = updates.step(planner_samples)
    assert metrics["role/planner/train/tokens_trained"] > 0 and not any(k.startswith("role/worker/") for k in metrics)
    after = {role: _adapter_weights(model, role) for role in ROLES}
    assert any(not torch.equal(before["planner"][k], after["planner"][k]) for k in before["planner"])
    assert all(torch.equal(before["worker"][k], after["worker"][k]) for k in before["worker"])
    assert updates.versions == {"planner": 1, "worker": 0} and updates.version == 1

    alternating = RoleSettings(schedule="alternating")
    trained = trained_roles(ROLES, alternating, 0)  # phase 0: the planner trains, the worker is frozen
    updates.step([s for s in planner_samples + worker_samples if s.role in trained])
    assert updates.versions == {"planner": 2, "worker": 0}
    assert all(torch.equal(before["worker"][k], v) for k, v in _adapter_weights(model, "worker").items())

    mid = {role: _adapter_weights(model, role) for role in ROLES}
    metrics = updates.step(planner_samples + worker_samples)  # joint: each role on its own samples
    assert updates.versions == {"planner": 3, "worker": 1} and updates.version == 3
    assert metrics["train/tokens_trained"] == sum(metrics[f"role/{r}/train/tokens_trained"] for r in ROLES)
    for role in ROLES:
        now = _adapter_weights(model, role)
        assert any(not torch.equal(mid[role][k], now[k]) for k in now)
    with pytest.raises(ValueError, match=r"role 'critic' is none of this run's roles"):
        updates.step([_sample("critic", tok, "x", 1.0)])

    saved = {role: _adapter_weights(model, role) for role in ROLES}  # a checkpoint restores every role's adapter
    updates.save_checkpoint(tmp_path / "checkpoint")
    updates.step(planner_samples + worker_samples)
    updates.load_checkpoint(tmp_path / "checkpoint")
    assert updates.versions == {"planner": 3, "worker": 1} and updates.version == 3
    for role in ROLES:
        assert all(torch.equal(saved[role][k], v) for k, v in _adapter_weights(model, role).items())
