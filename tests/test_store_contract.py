"""The TrajectoryStore contract: every backend (``sqlite`` on a file, ``memory``) passes the same tests.

These are the behaviours the runtime relies on: the coordinator's writes and
refusals, the trainer's bookkeeping (mark_trained, metrics, meta) and the
export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.rollouts import store_for
from mtrl_runtime.run_folder import RunFolder
from mtrl_runtime.store import STORES, TrajectoryStore, hash_token, open_store
from mtrl_runtime.store.memory import MemoryStore
from mtrl_runtime.types import BreakReason, ModelCall, Rollout, RolloutStatus, Task, ToolCall, Turn

TOKEN = "secret-token"


@pytest.fixture(params=["sqlite", "memory", "memory-from-config"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TrajectoryStore]:
    if request.param == "memory-from-config":  # the path a run takes: core.store picks the registered backend
        config = MtrlConfig.from_dict({"core": {"store": "memory", "run_dir": str(tmp_path / "run")}})
        s = store_for(config)
        assert isinstance(s, MemoryStore) and s.path == RunFolder(tmp_path / "run").store
    else:
        s = open_store(tmp_path / "run" / "trajectories.db", backend=request.param)
    yield s
    s.close()


def turn(rollout_id: str, index: int, prompt_ids: tuple[int, ...], **kw) -> Turn:
    completion = tuple(100 + 10 * index + i for i in range(3))
    fields = dict(messages=({"role": "user", "content": f"q{index}"},), logprobs=(-0.5, -1e-12, -3.25),
                  finish_reason="stop", completion_text=f"a{index}")
    fields.update(kw)
    return Turn(rollout_id=rollout_id, index=index, prompt_ids=prompt_ids, completion_ids=completion, **fields)


def start(store: TrajectoryStore, rollout_id: str, task_id: str = "t1", **kw) -> Rollout:
    if store.get_task(task_id) is None:
        store.put_task(Task(id=task_id, prompt="What is 6 x 7?", ground_truth=42))
    rollout = Rollout(id=rollout_id, task_id=task_id, group_id=kw.pop("group_id", "g1"), created_at=1.5, **kw)
    store.create_rollout(rollout, hash_token(TOKEN))
    return rollout


def test_both_backends_are_registered_and_satisfy_the_protocol(store: TrajectoryStore) -> None:
    assert STORES.names() == ["memory", "sqlite"]
    assert isinstance(store, TrajectoryStore)
    with pytest.raises(KeyError, match="known: memory, sqlite"):
        open_store("x.db", backend="nope")


def test_tasks_round_trip_and_a_put_replaces(store: TrajectoryStore) -> None:
    task = Task(id="t-ü", messages=({"role": "user", "content": [{"type": "text", "text": "hi"}]},),
                ground_truth={"answer": [1, 2.5, None]}, split="val", data={"tags": ["a"]})
    store.put_task(task)
    assert store.get_task("t-ü") == task
    store.put_task(Task(id="t-ü", prompt="new"))
    assert store.get_task("t-ü") == Task(id="t-ü", prompt="new")
    assert store.get_task("missing") is None
    with pytest.raises(ValueError, match="task.id"):
        store.put_task(Task(id="", prompt="x"))


def test_a_rollout_needs_a_recorded_task_and_a_new_id(store: TrajectoryStore) -> None:
    with pytest.raises(ValueError, match="put_task it first"):
        store.create_rollout(Rollout(id="r1", task_id="nope", group_id="g"), hash_token(TOKEN))
    start(store, "r1", step=2, policy_version=3)
    with pytest.raises(ValueError, match="already recorded"):
        start(store, "r1")
    with pytest.raises(ValueError, match="token_hash"):
        store.create_rollout(Rollout(id="r2", task_id="t1", group_id="g"), TOKEN)
    got = store.get_rollout("r1")
    assert (got.status, got.step, got.policy_version, got.created_at) == (RolloutStatus.RUNNING, 2, 3, 1.5)
    assert got.turns == () and got.tool_calls == () and got.reward is None
    assert store.get_rollout("missing") is None
    assert store.token_hash("r1") == hash_token(TOKEN) and store.token_hash("missing") is None


async def test_turns_round_trip_with_extended_prompts_and_exact_logprobs(store: TrajectoryStore) -> None:
    start(store, "r1")
    t0 = turn("r1", 0, (1, 2, 2**32 - 1), tools=({"type": "function", "function": {"name": "f"}},),
              tool_calls=({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},),
              policy_version=2, malformed_tool_call=True, started_at=10.5, latency_s=0.25,
              reasoning="first f, then — ünïcode", reasoning_tokens=7)
    t1 = turn("r1", 1, t0.prompt_ids + t0.completion_ids + (7, 8))  # extends turn 0
    t2 = turn("r1", 2, (3,), segment=1, break_reason=BreakReason.HISTORY_REWRITTEN, finish_reason="length")
    for t in (t2, t0, t1):  # the order of arrival does not matter
        await store.aadd_turn(t)
    got = store.get_rollout("r1")
    assert got.turns == (t0, t1, t2)
    assert got.turns[1].prompt_ids[: len(t0.prompt_ids) + 3] == t0.prompt_ids + t0.completion_ids
    assert got.turns[0].logprobs == (-0.5, -1e-12, -3.25)
    assert store.count_turns("r1") == 3 and store.count_turns("missing") == 0
    assert store.get_rollout("r1", with_turns=False).turns == ()
    with pytest.raises(ValueError, match="already recorded"):
        await store.aadd_turn(turn("r1", 1, (1,)))
    with pytest.raises(ValueError, match="one value per completion id"):
        await store.aadd_turn(turn("r1", 3, (1,), logprobs=(-1.0,)))
    with pytest.raises(ValueError, match="unknown rollout id"):
        await store.aadd_turn(turn("nope", 0, (1,)))


async def test_a_partial_rollouts_turn_keeps_the_version_of_each_token(store: TrajectoryStore) -> None:
    """A turn generated across a weight update stores the version behind each completion id; one generated
    under one version stores none (every id is ``policy_version``'s); a wrong length or a negative version is
    refused naming the field."""
    start(store, "r1")
    spanning = turn("r1", 0, (1, 2), policy_version=3, token_versions=(3, 3, 4))
    whole = turn("r1", 1, spanning.prompt_ids + spanning.completion_ids, policy_version=4)
    await store.aadd_turn(spanning)
    await store.aadd_turn(whole)
    got = store.get_rollout("r1").turns
    assert got == (spanning, whole)
    assert got[0].token_versions == (3, 3, 4) and got[0].versions_T == (3, 3, 4)
    assert got[1].token_versions is None and got[1].versions_T == (4, 4, 4)
    with pytest.raises(ValueError, match="turn.token_versions must have one version per completion id: 2 versions"):
        await store.aadd_turn(turn("r1", 2, (1,), token_versions=(1, 2)))
    with pytest.raises(ValueError, match="turn.token_versions must be integers"):
        await store.aadd_turn(turn("r1", 2, (1,), token_versions=(1, -1, 2)))
    assert store.count_turns("r1") == 2


async def test_a_finished_rollout_refuses_a_turn(store: TrajectoryStore) -> None:
    start(store, "r1")
    assert await store.afinish_rollout("r1", RolloutStatus.FAILED, "agent crashed")
    with pytest.raises(ValueError, match="is failed"):
        await store.aadd_turn(turn("r1", 0, (1,)))
    assert store.count_turns("r1") == 0


async def test_tool_calls_keep_their_order_of_arrival(store: TrajectoryStore) -> None:
    start(store, "r1")
    calls = [
        ToolCall(rollout_id="r1", name="lookup", arguments={"k": "A1"}, call_id="c1", result={"v": 42},
                 latency_s=0.01, turn_index=0, started_at=3.5),
        ToolCall(rollout_id="r1", name="lookup", arguments="{bad", error="KeyError", status="error"),
    ]
    assert [await store.aadd_tool_call(c) for c in calls] == [0, 1]
    assert store.get_rollout("r1").tool_calls == tuple(calls)
    assert store.count_tool_calls("r1") == 2 and store.count_tool_calls("missing") == 0
    with pytest.raises(ValueError, match="status"):
        await store.aadd_tool_call(ToolCall(rollout_id="r1", name="x", arguments={}, status="maybe"))


async def test_model_calls_are_kept_apart_from_turns_and_fixed_once_trained(store: TrajectoryStore) -> None:
    """A non-policy model call (a judge) is stored with its rollout, in order, never as a turn."""
    start(store, "r1")
    calls = [
        ModelCall(rollout_id="r1", protocol="openai", model="judge", latency_s=0.25, started_at=4.5,
                  input_tokens=17, output_tokens=3, stream=True),
        ModelCall(rollout_id="r1", protocol="bedrock", model=None, error="ThrottlingException: slow down", status="error"),
    ]
    assert [await store.aadd_model_call(c) for c in calls] == [0, 1]
    stored = store.get_rollout("r1")
    assert stored.model_calls == tuple(calls) and stored.turns == () and store.count_turns("r1") == 0
    assert store.get_rollout("r1", with_turns=False).model_calls == ()
    for bad, field in ((ModelCall(rollout_id="r1", protocol="openai", status="maybe"), "status"),
                       (ModelCall(rollout_id="r1", protocol="openai", input_tokens=-1), "input_tokens"),
                       (ModelCall(rollout_id="nope", protocol="openai"), "unknown rollout id")):
        with pytest.raises(ValueError, match=field):
            await store.aadd_model_call(bad)
    store.finish_rollout("r1", "completed")
    store.mark_trained(["r1"], 1)
    with pytest.raises(ValueError, match="model calls are fixed"):
        await store.aadd_model_call(calls[0])
    assert len(store.get_rollout("r1").model_calls) == 2


async def test_rewards_scalar_per_turn_and_defaulted(store: TrajectoryStore) -> None:
    for rid in ("r1", "r2", "r3"):
        start(store, rid)
    assert await store.aset_reward("r1", 1.0, metrics={"acc": 0.5})
    assert await store.aset_reward("r1", 0.25)  # the latest report wins
    r1 = store.get_rollout("r1")
    assert (r1.reward, r1.turn_rewards, dict(r1.metrics), r1.reward_defaulted) == (0.25, None, {}, False)
    assert await store.aset_reward("r2", turn_rewards=[0.5, -0.25])
    r2 = store.get_rollout("r2")
    assert (r2.reward, r2.turn_rewards, r2.total_reward) == (None, (0.5, -0.25), 0.25)
    assert not await store.aset_reward("r1", 0.0, defaulted=True)  # a reported reward stays
    assert await store.aset_reward("r3", 0.0, defaulted=True)
    r3 = store.get_rollout("r3")
    assert (r3.reward, r3.reward_defaulted) == (0.0, True)
    with pytest.raises(ValueError, match="exactly one"):
        await store.aset_reward("r1", 1.0, turn_rewards=[1.0])
    with pytest.raises(ValueError, match="finite"):
        await store.aset_reward("r1", float("nan"))
    with pytest.raises(ValueError, match="unknown rollout id"):
        await store.aset_reward("nope", 1.0)


async def test_a_final_status_is_given_once(store: TrajectoryStore) -> None:
    start(store, "r1")
    start(store, "r2")
    assert store.finish_rollout("r1", RolloutStatus.COMPLETED)
    assert not store.finish_rollout("r1", "failed", "late")
    assert await store.afinish_rollout("r2", "timed_out", "ran past 5s")
    r1, r2 = store.get_rollout("r1"), store.get_rollout("r2")
    assert (r1.status, r1.error) == (RolloutStatus.COMPLETED, None) and r1.finished_at is not None
    assert (r2.status, r2.error) == (RolloutStatus.TIMED_OUT, "ran past 5s")
    with pytest.raises(ValueError, match="final status"):
        store.finish_rollout("r1", RolloutStatus.RUNNING)
    with pytest.raises(ValueError, match="unknown rollout id"):
        store.finish_rollout("nope", "failed")


async def test_interrupted_is_a_final_status_that_takes_no_more_turns(store: TrajectoryStore) -> None:
    start(store, "r1")
    assert await store.afinish_rollout("r1", "interrupted", "cancelled: the run stopped")
    assert not store.finish_rollout("r1", RolloutStatus.COMPLETED)
    got = store.get_rollout("r1")
    assert (got.status, got.error) == (RolloutStatus.INTERRUPTED, "cancelled: the run stopped")
    assert [r.id for r in store.rollouts(status="interrupted", with_turns=False)] == ["r1"]
    assert store.rollouts(status=RolloutStatus.RUNNING, with_turns=False) == []
    with pytest.raises(ValueError, match="is interrupted"):
        await store.aadd_turn(turn("r1", 0, (1,)))


async def test_rollouts_filter_in_creation_order(store: TrajectoryStore) -> None:
    start(store, "b", step=1, group_id="g1")
    start(store, "a", step=1, group_id="g2")
    start(store, "c", step=2, group_id="g1")
    store.finish_rollout("b", "completed")
    store.finish_rollout("c", "completed")
    store.mark_trained(["c"], 5)
    assert [r.id for r in store.rollouts()] == ["b", "a", "c"]
    assert [r.id for r in store.rollouts(step=1)] == ["b", "a"]
    assert [r.id for r in store.rollouts(status="completed")] == ["b", "c"]
    assert [r.id for r in store.rollouts(status=RolloutStatus.RUNNING)] == ["a"]
    assert [r.id for r in store.rollouts(group_id="g1", untrained_only=True)] == ["b"]
    assert all(r.turns == () for r in store.rollouts(with_turns=False))


async def test_mark_trained_is_all_or_nothing_and_never_twice(store: TrajectoryStore) -> None:
    for rid in ("r1", "r2", "r3"):
        start(store, rid)
    store.finish_rollout("r1", "completed")
    store.finish_rollout("r2", "failed")
    assert store.trained_step("r1") is None
    with pytest.raises(ValueError, match="still running"):
        store.mark_trained(["r1", "r3"], 1)
    with pytest.raises(ValueError, match="unknown rollout ids"):
        store.mark_trained(["r1", "nope"], 1)
    with pytest.raises(ValueError, match="at most once"):
        store.mark_trained(["r1", "r1"], 1)
    assert store.trained_step("r1") is None  # nothing changed
    store.mark_trained(["r1", "r2"], 1)
    assert (store.trained_step("r1"), store.trained_step("r2"), store.trained_step("r3")) == (1, 1, None)
    with pytest.raises(ValueError, match="already trained"):
        store.mark_trained(["r2"], 2)
    with pytest.raises(ValueError, match="reward is fixed"):
        await store.aset_reward("r1", 1.0)
    with pytest.raises(ValueError, match="tool calls are fixed"):
        await store.aadd_tool_call(ToolCall(rollout_id="r1", name="x", arguments={}))
    with pytest.raises(ValueError, match="unknown rollout id"):
        store.trained_step("nope")


def test_metric_history_in_step_order(store: TrajectoryStore) -> None:
    store.log_metrics(2, {"loss": 0.5, "reward": 1.0})
    store.log_metrics(1, {"loss": 0.75})
    store.log_metrics(2, {"loss": 0.25})
    assert store.metric_history("loss") == [(1, "loss", 0.75), (2, "loss", 0.5), (2, "loss", 0.25)]
    assert store.metric_history() == [(1, "loss", 0.75), (2, "loss", 0.5), (2, "reward", 1.0), (2, "loss", 0.25)]
    with pytest.raises(ValueError, match="finite"):
        store.log_metrics(3, {"loss": float("inf")})


def test_meta_holds_json_values(store: TrajectoryStore) -> None:
    assert store.get_meta("checkpoint") is None and store.get_meta("checkpoint", {}) == {}
    store.set_meta("checkpoint", {"next_step": 3, "ids": ("a", "b")})
    store.set_meta("run", "abc")
    store.set_meta("run", "def")
    store.flush()
    assert store.get_meta("checkpoint") == {"next_step": 3, "ids": ["a", "b"]}  # JSON in, JSON out
    assert store.get_meta("run") == "def"
    with pytest.raises(ValueError, match="JSON"):
        store.set_meta("bad", object())


async def test_export_jsonl_writes_one_self_contained_line_per_rollout(store: TrajectoryStore, tmp_path: Path) -> None:
    start(store, "r1", step=1)
    start(store, "r2", step=2)
    t0 = turn("r1", 0, (1, 2))
    await store.aadd_turn(t0)
    await store.aadd_tool_call(ToolCall(rollout_id="r1", name="f", arguments={"x": 1}, turn_index=0))
    await store.aset_reward("r1", turn_rewards=[0.5])
    store.finish_rollout("r1", "completed")
    store.mark_trained(["r1"], 4)
    out = tmp_path / "rollouts.jsonl"
    assert store.export_jsonl(out) == 2
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["r1", "r2"]
    first = lines[0]
    assert (first["status"], first["turn_rewards"], first["total_reward"], first["trained_step"]) == (
        "completed", [0.5], 0.5, 4)
    assert first["task"]["ground_truth"] == 42 and first["turns"][0]["prompt_ids"] == [1, 2]
    assert first["turns"][0]["logprobs"] == list(t0.logprobs)
    assert first["tool_calls"][0]["arguments"] == {"x": 1}
    assert "token_hash" not in first
    assert store.export_jsonl(out, step=2) == 1
