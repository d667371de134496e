"""SageMaker agents at group size 2 (siblings share their prompt): no turn ever trained on another agent's rollout.

SageMaker's ``wrap_model`` writes the trajectory header into the model's
shared ``client_args`` when a rollout calls ``stream()``; the OpenAI client
reads it later, so one wrapped model shared by concurrent rollouts sends other
rollouts' headers, and siblings' messages cannot tell them apart. The agents
are SageMaker's own patterns, unmodified (``sagemaker_rft_handler``,
``wrap_model(OpenAIModel)``, ``RolloutFeedbackClient``, SigV4 tokens, on
AgentCore's ``app.run()``): one model per rollout, and one model shared by
all. Each notes what its agent was answered (``MTRL_TEST_SEEN``); the scripted
policy writes the rollout each reply was recorded on into its final answer,
and tool-call ids are minted per reply: so the test knows, for every stored
turn, which agent received it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from _adapter_support import OFFSET, agent_process, key_of, policy, run_all, value_of
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.executors import HttpExecutor
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

pytest.importorskip("sagemaker.train.rft")
pytest.importorskip("bedrock_agentcore")

DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "dummy-secret", "AWS_REGION": "local"}
KEYS = (0, 1, 2, 4, 6, 7, 8, 9, 10, 11)  # ten tasks; no K03 (its tool fails) or K05 (its agent crashes)
GROUP_SIZE = 2


def _compat() -> MtrlConfig:
    return MtrlConfig.from_dict({"advanced": {"server": {
        "sagemaker_compat": True, "sagemaker_access_key_id": DUMMY_AWS["AWS_ACCESS_KEY_ID"],
        "sagemaker_secret": DUMMY_AWS["AWS_SECRET_ACCESS_KEY"]}}})


def _signed(request: Any, prompt: str) -> ScriptedReply | str:
    """The adapter tests' policy (lookup, add, answer), whose answer names the rollout it is recorded on."""
    reply = policy(request, prompt)
    return f"{reply} [{request.rollout_id}]" if isinstance(reply, str) else reply


def _group_specs(handle: Any) -> list[RolloutSpec]:
    """``GROUP_SIZE`` rollouts of each task in one group, as the dispatcher opens them."""
    out = []
    for k in KEYS:
        key = f"K{k:02d}"
        task = Task(id=f"t{k:02d}", prompt=f"What is the value of key {key} plus {OFFSET}?",
                    data={"answer": value_of(key) + OFFSET})
        group = None
        for _ in range(GROUP_SIZE):
            created = handle.coordinator.create_rollout(task, group_id=group)
            group = created.group_id
            out.append(RolloutSpec(rollout_id=created.rollout_id, group_id=created.group_id, task=task,
                                   token=created.token, endpoint=handle.url, model_name="policy",
                                   sampling=SamplingParams(max_tokens=256), max_turns=8, timeout_s=120.0))
    return out


async def _run(served: Any, tiny_tok: Any, tmp_path: Any, *agent: str) -> tuple[Any, list, dict[str, Any]]:
    handle = served(ScriptedEngine(tiny_tok, _signed), _compat())
    seen_file = tmp_path / "seen.jsonl"
    with agent_process(*agent, handle.url, *(["header"] if agent == ("sagemaker-shared",) else []), health="/ping",
                       timeout=120, env={**DUMMY_AWS, "MTRL_TEST_SEEN": str(seen_file)}) as (_, url, _):
        runs = _group_specs(handle)
        await run_all(HttpExecutor.for_agentcore(url, coordinator=handle.coordinator), runs)
    seen = {s["rollout_id"]: s for s in map(json.loads, seen_file.read_text().splitlines())}
    return handle, runs, seen


def _misdelivered(turn: Any, spec: RolloutSpec, seen: dict[str, Any]) -> bool:
    """Whether a turn stored on ``spec``'s rollout was answered to another rollout's agent."""
    mine = seen.get(spec.rollout_id, {"tool_use_ids": [], "texts": []})
    ids = [call["id"] for call in turn.tool_calls]
    if ids:
        return not set(ids) <= set(mine["tool_use_ids"])
    return not any(f"[{spec.rollout_id}]" in text for text in mine["texts"])


async def test_one_model_per_rollout_at_group_size_2_completes_every_rollout_on_its_own_turns(served, tiny_tok, tmp_path):
    """SageMaker's per-rollout model sends its own header on every call: siblings' first calls are taken as named."""
    handle, runs, seen = await _run(served, tiny_tok, tmp_path, "sagemaker")
    for spec in runs:
        record = handle.store.get_rollout(spec.rollout_id)
        assert record.status is RolloutStatus.COMPLETED, record.error
        assert len(record.turns) == 3 and not any(_misdelivered(t, spec, seen) for t in record.turns)
        assert record.turn_rewards == (0.0, 0.0, 1.0) and not record.reward_defaulted
    assert handle.coordinator.counters["compat_stale_header_refused"] == 0
    assert handle.coordinator.counters["compat_reattributed"] == 0


async def test_a_shared_wrap_model_at_group_size_2_is_refused_never_misattributed(served, tiny_tok, tmp_path):
    """One module-level wrap_model for 20 rollouts of 10 groups: no completed rollout holds a turn another agent
    received, no turn lands on another task's rollout, and what cannot be told apart is refused, naming the fix."""
    handle, runs, seen = await _run(served, tiny_tok, tmp_path, "sagemaker-shared")
    counters = handle.coordinator.counters
    completed = 0
    for spec in runs:
        record = handle.store.get_rollout(spec.rollout_id)
        for turn in record.turns:
            assert key_of(str(turn.messages[0])) == key_of(spec.task.prompt)  # never on another task's rollout
        if record.status is RolloutStatus.COMPLETED:
            completed += 1
            assert not any(_misdelivered(t, spec, seen) for t in record.turns), spec.rollout_id
            continue
        assert record.status is RolloutStatus.FAILED
        assert "wrap_model" in record.error and "one wrapped model per rollout" in record.error, record.error
    refused = counters["compat_stale_header_refused"]
    assert refused > 0  # the shared model's stale headers among siblings were refused, not guessed
    assert counters["rollouts_failed"] == len(runs) - completed


def test_sigv4_calls_among_siblings_follow_the_header_and_are_refused_when_their_messages_say_otherwise(
        served, tiny_tok, monkeypatch):
    """The rules of ``coordinator._owner``, deterministically, with the calls a shared wrap_model makes."""
    import openai
    from sagemaker.core.token_generator import generate_token

    from _adapter_support import TOOLS
    from mtrl_adapters.wire import trajectory_id

    for name, value in DUMMY_AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    a, a2, b, b2 = _group_specs(handle)[:4]  # two groups: a and a2 share a prompt, b and b2 another
    sigv4 = generate_token(region="local")
    counters = handle.coordinator.counters

    def call(header: RolloutSpec, messages: list[dict]) -> Any:
        client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=sigv4, max_retries=0, default_headers={
            "X-Amzn-SageMaker-Trajectory-Id": trajectory_id(header.rollout_id, header.token)})
        return client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)

    def turns(spec: RolloutSpec) -> int:
        return len(handle.store.get_rollout(spec.rollout_id).turns)

    first_a = [{"role": "user", "content": a.task.prompt}]
    with pytest.raises(openai.ConflictError, match="task prompt of rollouts") as refused:  # rule 3: b names no sibling
        call(b, first_a)
    assert "one wrapped model per rollout" in str(refused.value)
    rewritten = first_a + [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_elsewhere", "type": "function",
                           "function": {"name": "lookup", "arguments": "{}"}}]},
                           {"role": "tool", "tool_call_id": "call_elsewhere", "content": "0"}]
    with pytest.raises(openai.ConflictError, match="task prompt of rollouts"):  # a history, no id known: the same
        call(b, rewritten)
    reply = call(a2, first_a).choices[0].message  # the header names a sibling in the sender's state: taken as named
    assert (turns(a2), turns(a)) == (1, 0)
    with pytest.raises(openai.ConflictError, match="may be theirs"):  # rule 4: a2 answered, a not: either sent it
        call(a2, first_a)
    follow = first_a + [reply.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "10"}]
    with pytest.raises(openai.ConflictError, match="minted for rollout"):  # rule 1: a2's reply, a's header
        call(a, follow)
    stored = handle.store.get_rollout(a2.rollout_id)  # its reply reached an agent naming another rollout: ended
    assert stored.status is RolloutStatus.FAILED and stored.metrics["trajectory_header_stale"] == 1.0
    assert "wrap_model" in stored.error and turns(a) == 0
    first_b = [{"role": "user", "content": b.task.prompt}]
    call(b2, first_b)  # each sibling's own first call, then its continuation, as named
    call(b, first_b)
    assert (turns(b), turns(b2)) == (1, 1)
    assert counters["compat_stale_header_refused"] == 4 and counters["compat_reattributed"] == 0


def test_attribution_broken_ends_a_rollout_failed_whatever_its_agent_reports_later():
    from mtrl_runtime.coordinator import RolloutLife
    from mtrl_runtime.types import AgentEnded, AttributionBroken, RewardReported

    life = RolloutLife()
    ending = life.decide(AttributionBroken("its reply reached another agent", "trajectory_header_stale"))
    assert (ending.status, ending.error, dict(ending.flags)) == (
        RolloutStatus.FAILED, "its reply reached another agent", {"trajectory_header_stale": 1.0})
    assert life.decide(RewardReported()) is None and life.decide(AgentEnded(RolloutStatus.COMPLETED)) is None
