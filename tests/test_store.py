"""The trajectory store on real SQLite files: round trips, invariants, durability under SIGKILL.

``python tests/test_store.py bench`` measures add_turn throughput and commit latency.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mtrl_runtime.store import SQLiteStore, hash_token
from mtrl_runtime.types import BreakReason, Rollout, RolloutStatus, Task, ToolCall, Turn

ROOT = Path(__file__).resolve().parents[1]
TOKEN_HASH = hash_token("secret-token")


def make_turn(rollout_id: str, index: int, prompt_ids: tuple[int, ...], n_completion: int = 5, **kw) -> Turn:
    completion = tuple(1000 + 7 * index + i for i in range(n_completion))
    defaults = dict(
        messages=({"role": "user", "content": f"question {index}"},),
        logprobs=tuple(-1.0 / (i + 3) - 1e-17 * index for i in range(n_completion)),
        finish_reason="stop",
        completion_text=f"answer {index}",
    )
    defaults.update(kw)
    return Turn(rollout_id=rollout_id, index=index, prompt_ids=prompt_ids, completion_ids=completion, **defaults)


def start_rollout(store: SQLiteStore, rollout_id: str, task_id: str = "t1", **kw) -> Rollout:
    if store.get_task(task_id) is None:
        store.put_task(Task(id=task_id, prompt="What is 6 x 7?", ground_truth=42))
    rollout = Rollout(id=rollout_id, task_id=task_id, group_id=kw.pop("group_id", "g1"), created_at=1.5, **kw)
    store.create_rollout(rollout, TOKEN_HASH)
    return rollout


def table_counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("tasks", "rollouts", "turns", "tool_calls", "metrics", "meta")
        }


def dump(path: Path) -> list:
    """Every row of every table, to assert a failed write changed nothing."""
    with sqlite3.connect(path) as conn:
        return [
            conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
            for t in ("tasks", "rollouts", "turns", "tool_calls", "metrics", "meta")
        ]


@pytest.fixture
def store(tmp_path: Path):
    s = SQLiteStore(tmp_path / "run" / "trajectories.db")
    yield s
    s.close()


def full_rollout() -> tuple[Task, Rollout]:
    """A rollout that sets every field of every type, with awkward ids and floats."""
    task = Task(
        id="task-ü",
        messages=(
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ),
        ground_truth={"answer": [1, 2.5, None, "x"]},
        split="val",
        data={"difficulty": 3, "tags": ["a", "b"]},
    )
    p0 = (0, 1, 2**32 - 1, 17)
    t0 = Turn(
        rollout_id="r-full", index=0, messages=task.messages, prompt_ids=p0, completion_ids=(5, 0, 2**31 - 1),
        logprobs=(-1.2345678901234567, -5e-324, -0.0), finish_reason="stop",
        completion_text="<tool_call>{}</tool_call>",
        tool_calls=({"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"k": "A1"}'}},),
        tools=({"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},),
        policy_version=3, segment=0, malformed_tool_call=True, started_at=1700000000.123456, latency_s=0.25,
    )
    p1 = p0 + t0.completion_ids + (9, 9)  # extends turn 0
    t1 = Turn(
        rollout_id="r-full", index=1, messages=task.messages + ({"role": "tool", "content": "42"},), prompt_ids=p1,
        completion_ids=(8,), logprobs=(-3.0e-8,), finish_reason="length", completion_text="<think>two ✓</think>4",
        policy_version=4, segment=0, started_at=1700000001.5, latency_s=0.125, reasoning="two ✓", reasoning_tokens=3,
    )
    t2 = Turn(  # history rewritten: a new segment
        rollout_id="r-full", index=2, messages=({"role": "user", "content": "again"},), prompt_ids=(3, 4),
        completion_ids=(6, 7), logprobs=(-0.5, -math.pi), finish_reason="stop", completion_text="ok",
        segment=1, break_reason=BreakReason.HISTORY_REWRITTEN,
    )
    calls = (
        ToolCall(rollout_id="r-full", name="lookup", arguments={"k": "A1"}, call_id="c1", result={"value": 42},
                 latency_s=0.01, turn_index=0, started_at=1700000000.5),
        ToolCall(rollout_id="r-full", name="lookup", arguments='{"k": bad', error="KeyError: 'B2'", status="error",
                 turn_index=1, source="mcp:notes"),
    )
    rollout = Rollout(
        id="r-full", task_id=task.id, group_id="g-1", status=RolloutStatus.COMPLETED, turns=(t0, t1, t2),
        tool_calls=calls, turn_rewards=(0.5, -0.25, 1e-300), metrics={"completion": 1.0, "field_acc": 0.75},
        error=None, policy_version=3, step=7, created_at=1700000000.0, finished_at=1700000002.0,
    )
    return task, rollout


# ---- round trips -------------------------------------------------------------


def test_round_trip_of_every_type_is_exact(store: SQLiteStore) -> None:
    task, rollout = full_rollout()
    store.put_task(task)
    store.create_rollout(rollout, TOKEN_HASH)
    assert store.get_task(task.id) == task
    assert store.get_rollout(rollout.id) == rollout
    assert store.get_rollout(rollout.id, with_turns=False) == Rollout(
        **{**rollout.__dict__, "turns": (), "tool_calls": ()}
    )
    assert store.count_turns(rollout.id) == 3
    assert store.get_rollout("nope") is None and store.get_task("nope") is None

    # the same data through the hot-path writes
    store.create_rollout(Rollout(id="r2", task_id=task.id, group_id="g-1", policy_version=3, created_at=2.0),
                         TOKEN_HASH)
    for turn in rollout.turns:
        store.add_turn(Turn(**{**turn.__dict__, "rollout_id": "r2"}))
    seqs = [store.add_tool_call(ToolCall(**{**c.__dict__, "rollout_id": "r2"})) for c in rollout.tool_calls]
    assert seqs == [0, 1]
    store.set_reward("r2", turn_rewards=[0.5, -0.25, 1e-300], metrics={"completion": 1.0, "field_acc": 0.75})
    assert store.finish_rollout("r2", "completed") is True
    got = store.get_rollout("r2")
    assert got.turns == tuple(Turn(**{**t.__dict__, "rollout_id": "r2"}) for t in rollout.turns)
    assert got.tool_calls == tuple(ToolCall(**{**c.__dict__, "rollout_id": "r2"}) for c in rollout.tool_calls)
    assert (got.turn_rewards, got.reward, got.status) == ((0.5, -0.25, 1e-300), None, RolloutStatus.COMPLETED)
    assert got.finished_at is not None and abs(got.finished_at - time.time()) < 60


def test_extending_prompts_are_stored_once_and_rebuilt_exactly(store: SQLiteStore) -> None:
    start_rollout(store, "r1")
    prompt = tuple(range(300))
    turns = []
    for index in range(4):
        if index == 2:  # a break: a prompt that does not start with the previous context
            prompt = (7,) + prompt
        turn = make_turn("r1", index, prompt, n_completion=50)
        store.add_turn(turn)
        turns.append(turn)
        prompt = prompt + turn.completion_ids + (11, 12, 13)
    assert store.get_rollout("r1").turns == tuple(turns)
    with sqlite3.connect(store.path) as conn:
        stored = conn.execute("SELECT prompt_prefix_len, length(prompt_ids) / 4 FROM turns ORDER BY idx").fetchall()
    assert stored == [(0, 300), (350, 3), (0, 407), (457, 3)]  # 407 = 1 + 353 + 50 + 3


# ---- invariants ---------------------------------------------------------------


def test_a_final_status_is_never_overwritten(store: SQLiteStore) -> None:
    start_rollout(store, "r1")
    assert store.finish_rollout("r1", RolloutStatus.TIMED_OUT, error="no answer in 600 s") is True
    assert store.finish_rollout("r1", "completed") is False
    assert store.finish_rollout("r1", "failed", error="late") is False
    got = store.get_rollout("r1")
    assert (got.status, got.error) == (RolloutStatus.TIMED_OUT, "no answer in 600 s")
    with pytest.raises(ValueError, match="status must be a final status"):
        store.finish_rollout("r1", "running")
    with pytest.raises(ValueError, match="is timed_out; turn.index 0 cannot be added"):
        store.add_turn(make_turn("r1", 0, (1, 2)))
    with pytest.raises(ValueError, match="unknown rollout id 'r9'"):
        store.finish_rollout("r9", "completed")


def test_mark_trained_twice_raises_and_changes_nothing(store: SQLiteStore) -> None:
    for rid in ("a", "b", "c", "d"):
        start_rollout(store, rid)
    for rid in ("a", "b", "c"):
        store.finish_rollout(rid, "completed")
    store.mark_trained(["a", "b"], step=1)
    before = dump(store.path)
    with pytest.raises(ValueError, match=r"already trained .*'b': 1"):
        store.mark_trained(["c", "b"], step=2)
    with pytest.raises(ValueError, match=r"unknown rollout ids \['zz'\]"):
        store.mark_trained(["c", "zz"], step=2)
    with pytest.raises(ValueError, match=r"still running.*'d'"):
        store.mark_trained(["c", "d"], step=2)
    with pytest.raises(ValueError, match="duplicates"):
        store.mark_trained(["c", "c"], step=2)
    assert dump(store.path) == before
    assert [store.trained_step(r) for r in "abcd"] == [1, 1, None, None]
    assert [r.id for r in store.rollouts(untrained_only=True, with_turns=False)] == ["c", "d"]
    with pytest.raises(ValueError, match="trained at step 1; its reward is fixed"):
        store.set_reward("a", reward=1.0)


def test_reward_reports_and_defaults(store: SQLiteStore) -> None:
    start_rollout(store, "r1")
    start_rollout(store, "r2")
    assert store.set_reward("r1", 0.0, defaulted=True) is True
    assert store.set_reward("r1", reward=1.0, metrics={"completion": 1.0}) is True  # a late report wins
    assert store.set_reward("r1", reward=-3.0, defaulted=True) is False  # a default never replaces a report
    got = store.get_rollout("r1", with_turns=False)
    assert (got.reward, got.turn_rewards, got.reward_defaulted, dict(got.metrics)) == (1.0, None, False,
                                                                                      {"completion": 1.0})
    store.set_reward("r1", turn_rewards=[0.25, 0.5])  # the latest report replaces the scalar
    got = store.get_rollout("r1", with_turns=False)
    assert (got.reward, got.turn_rewards, got.total_reward) == (None, (0.25, 0.5), 0.75)
    assert store.set_reward("r2", reward=0.0, defaulted=True) is True
    assert store.get_rollout("r2").reward_defaulted is True


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda s: s.set_reward("r1", reward=float("nan")), "reward must be a finite number, got nan"),
        (lambda s: s.set_reward("r1", turn_rewards=[1.0, float("inf")]), r"turn_rewards\[1\] must be a finite"),
        (lambda s: s.set_reward("r1", reward=1.0, turn_rewards=[1.0]), "exactly one of reward and turn_rewards"),
        (lambda s: s.set_reward("r1", reward=1.0, metrics={"m": float("nan")}), r"metrics\['m'\] must be a finite"),
        (lambda s: s.set_reward("ghost", reward=1.0), "unknown rollout id 'ghost'"),
        (lambda s: s.add_turn(make_turn("ghost", 0, (1,))), "turn.rollout_id: unknown rollout id 'ghost'"),
        (lambda s: s.add_turn(make_turn("r1", 0, (1,))), "turn.index 0 of rollout 'r1' is already recorded"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1, -4))), r"turn.prompt_ids must be integers in \[0, "),
        (lambda s: s.add_turn(make_turn("r1", 1, (2**32,))), "turn.prompt_ids must be integers"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1,), logprobs=(-1.0,))), "1 logprobs for 5 ids"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1,), n_completion=2, logprobs=(-1.0, float("nan")))),
         r"turn.logprobs\[1\] must be a finite number, got nan"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1,), messages=({"x": object()},))), "turn.messages must be JSON"),
        (lambda s: s.add_turn(make_turn("r1", -1, (1,))), "turn.index must be an integer >= 0, got -1"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1,), latency_s=-1.0)), "turn.latency_s must be >= 0"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1,), reasoning=3)), "turn.reasoning must be a string, got 3"),
        (lambda s: s.add_turn(make_turn("r1", 1, (1,), reasoning_tokens=-2)),
         "turn.reasoning_tokens must be an integer >= 0, got -2"),
        (lambda s: s.add_tool_call(ToolCall("ghost", "f", {})), "tool_call.rollout_id: unknown rollout id"),
        (lambda s: s.add_tool_call(ToolCall("r1", "f", {}, status="ok")), "tool_call.status must be"),
        (lambda s: s.add_tool_call(ToolCall("r1", "", {})), "tool_call.name must be a non-empty string"),
        (lambda s: s.add_tool_call(ToolCall("r1", "f", {}, source="")), "tool_call.source must be a non-empty string"),
        (lambda s: s.create_rollout(Rollout("r1", "t1", "g"), TOKEN_HASH), "rollout.id 'r1' is already recorded"),
        (lambda s: s.create_rollout(Rollout("r5", "t9", "g"), TOKEN_HASH), "rollout.task_id 't9' is not a recorded"),
        (lambda s: s.create_rollout(Rollout("r5", "t1", "g"), "secret-token"), "token_hash must be a sha256"),
        (lambda s: s.put_task(Task(id="t2")), "give prompt or messages"),
        (lambda s: s.log_metrics(1, {"loss": float("inf")}), r"metrics\['loss'\] must be a finite number"),
        (lambda s: s.log_metrics(-1, {"loss": 1.0}), "step must be an integer >= 0, got -1"),
        (lambda s: s.set_meta("schema_version", 2), "reserved"),
        (lambda s: s.set_meta("k", {1, 2}), "must be JSON-serializable"),
        (lambda s: s.mark_trained([], 1), "at least one rollout"),
    ],
)
def test_bad_writes_raise_naming_the_field_and_change_nothing(store, write, message) -> None:
    start_rollout(store, "r1")
    store.add_turn(make_turn("r1", 0, (1, 2, 3)))
    before = dump(store.path)
    with pytest.raises(ValueError, match=message):
        write(store)
    assert dump(store.path) == before


def test_one_failing_write_in_a_batch_leaves_the_others_committed(store: SQLiteStore) -> None:
    start_rollout(store, "r1")

    async def main() -> list:
        writes = [store.aadd_turn(make_turn("r1", i % 50, (i,))) for i in range(100)]  # 50 duplicates
        return await asyncio.gather(*writes, return_exceptions=True)

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, ValueError)]
    assert len(errors) == 50 and all("already recorded" in str(e) for e in errors)
    assert [t.prompt_ids for t in store.get_rollout("r1").turns] == [(i,) for i in range(50)]


# ---- concurrency, history, reopen ------------------------------------------------------


async def test_concurrent_async_writers_all_commit(store: SQLiteStore) -> None:
    for w in range(32):
        start_rollout(store, f"r{w}")

    async def agent(w: int) -> None:
        prompt = tuple(range(w, w + 300))
        for i in range(10):
            turn = make_turn(f"r{w}", i, prompt, n_completion=50)
            await store.aadd_turn(turn)
            assert store.count_turns(f"r{w}") == i + 1  # durable and visible once awaited
            await store.aadd_tool_call(ToolCall(f"r{w}", "f", {"i": i}, turn_index=i))
            prompt = prompt + turn.completion_ids + (1, 2)
        await store.aset_reward(f"r{w}", reward=float(w))
        assert await store.afinish_rollout(f"r{w}", "completed") is True

    await asyncio.gather(*(agent(w) for w in range(32)))
    got = store.rollouts(status="completed")
    assert [r.id for r in got] == [f"r{w}" for w in range(32)]
    assert all(len(r.turns) == 10 and len(r.tool_calls) == 10 for r in got)
    assert [r.reward for r in got] == [float(w) for w in range(32)]
    assert [c.arguments["i"] for c in got[5].tool_calls] == list(range(10))


async def test_a_cancelled_awaiter_does_not_cancel_its_write(store: SQLiteStore) -> None:
    start_rollout(store, "r1")
    task = asyncio.ensure_future(store.aadd_turn(make_turn("r1", 0, (1, 2))))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    store.flush()
    assert store.count_turns("r1") == 1


def test_reads_from_other_threads_see_every_returned_write(store: SQLiteStore) -> None:
    start_rollout(store, "r1")
    errors: list[BaseException] = []

    def writer_and_reader(k: int) -> None:
        try:
            for i in range(20):
                store.add_turn(make_turn("r1", 100 * k + i, (i,)))
                indices = {t.index for t in store.get_rollout("r1").turns}
                assert set(range(100 * k, 100 * k + i + 1)) <= indices  # this thread's writes, all visible
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=writer_and_reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and store.count_turns("r1") == 40


def test_nothing_is_kept_in_memory_per_stored_turn(store: SQLiteStore) -> None:
    import gc
    import tracemalloc

    start_rollout(store, "r1")
    prompt = tuple(range(300))

    def write(first: int, n: int) -> None:
        for i in range(first, first + n):
            store.add_turn(make_turn("r1", i, prompt, n_completion=50))  # ~3 KB of ids a turn in Python

    write(0, 50)  # warm up caches (statement cache, reader connection)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        write(50, 500)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.count_turns("r1") == 550
    assert grown < 50_000, f"{grown} bytes kept after 500 turns (each ~3 KB of ids)"


def test_metric_history(store: SQLiteStore) -> None:
    store.log_metrics(0, {"rollout/reward/mean": 0.25, "train/loss": 1.5})
    store.log_metrics(2, {"rollout/reward/mean": 0.75})
    store.log_metrics(1, {"rollout/reward/mean": 0.5})
    assert store.metric_history("rollout/reward/mean") == [
        (0, "rollout/reward/mean", 0.25), (1, "rollout/reward/mean", 0.5), (2, "rollout/reward/mean", 0.75)
    ]
    assert store.metric_history() == [
        (0, "rollout/reward/mean", 0.25), (0, "train/loss", 1.5), (1, "rollout/reward/mean", 0.5),
        (2, "rollout/reward/mean", 0.75),
    ]
    assert store.metric_history("nope") == []


def test_reopen_after_close_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.db"
    task, rollout = full_rollout()
    with SQLiteStore(path) as first:
        first.put_task(task)
        first.create_rollout(rollout, TOKEN_HASH)
        first.mark_trained([rollout.id], step=7)
        first.log_metrics(7, {"train/loss": 0.5})
        first.set_meta("checkpoint", {"step": 7, "data_position": 1024})
        start_rollout(first, "r-open")
        first.add_turn(make_turn("r-open", 0, (1, 2)))
    with pytest.raises(RuntimeError, match="closed"):
        first.add_turn(make_turn("r-open", 1, (1, 2)))
    with pytest.raises(RuntimeError, match="closed"):
        first.count_turns("r-open")

    second = SQLiteStore(path)
    try:
        assert second.schema_version == 6 and second.get_meta("schema_version") == 6
        assert second.get_rollout(rollout.id) == rollout and second.trained_step(rollout.id) == 7
        assert second.metric_history() == [(7, "train/loss", 0.5)]
        assert second.get_meta("checkpoint") == {"step": 7, "data_position": 1024}
        assert second.get_meta("missing", default="d") == "d"
        second.add_turn(make_turn("r-open", 1, (1, 2) + make_turn("r-open", 0, ()).completion_ids))  # resume
        assert second.count_turns("r-open") == 2
    finally:
        second.close()


def test_opens_a_version_1_store_and_migrates_it_to_version_2(tmp_path: Path) -> None:
    """A store mtrl wrote at schema version 1 (tests/data/store_v1.sql) opens: everything reads back, its turns
    have no reasoning recorded apart (None, 0; the text is still in completion_text), and new turns keep theirs."""
    path = tmp_path / "trajectories.db"
    with sqlite3.connect(path) as conn:
        conn.executescript((ROOT / "tests" / "data" / "store_v1.sql").read_text())
    with SQLiteStore(path) as store:
        assert store.schema_version == 6 and store.get_meta("schema_version") == 6
        old = store.get_rollout("r1")
        assert old is not None and old.status is RolloutStatus.COMPLETED and old.reward == 1.0
        assert [t.index for t in old.turns] == [0, 1] and old.turns[1].prompt_ids == (1, 2, 3, 10, 11, 12, 13, 20, 21)
        assert old.turns[0].completion_text.startswith("<think>\nThe logbook first.")
        assert [(t.reasoning, t.reasoning_tokens) for t in old.turns] == [(None, 0), (None, 0)]
        assert [t.model for t in old.turns] == [None, None]  # version 3: a version-1 turn is the policy's
        assert old.turns[0].tool_calls[0]["function"]["name"] == "logbook" and old.tool_calls[0].result == "clean"
        assert [c.source for c in old.tool_calls] == [None] * len(old.tool_calls)  # version 4: none recorded before
        assert [t.token_versions for t in old.turns] == [None, None]  # version 5: each turn under one version
        assert all(t.versions_T == (t.policy_version,) * len(t.completion_ids) for t in old.turns)
        assert [t.role for t in old.turns] == [None, None]  # version 6: a version-1 turn is the one policy's
        start_rollout(store, "r-new")
        store.add_turn(make_turn("r-new", 0, (1, 2), reasoning="check the logbook", reasoning_tokens=4))
    with SQLiteStore(path) as again:  # reopened at version 2: nothing migrates twice, the new turn kept its reasoning
        turn = again.get_rollout("r-new").turns[0]
        assert (turn.reasoning, turn.reasoning_tokens) == ("check the logbook", 4)
        assert again.get_rollout("r1") == old
    lines = (tmp_path / "out.jsonl")
    with SQLiteStore(path) as store:
        store.export_jsonl(lines)
    exported = {r["id"]: r for r in map(json.loads, lines.read_text().splitlines())}
    assert exported["r-new"]["turns"][0]["reasoning"] == "check the logbook"
    assert exported["r1"]["turns"][0]["reasoning"] is None


def test_refuses_a_newer_schema_and_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(RuntimeError, match="schema_version 99 is newer"):
        SQLiteStore(path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE x (a)")
    with pytest.raises(RuntimeError, match="not a trajectory store"):
        SQLiteStore(other)


# ---- export -------------------------------------------------------------------------------


def test_export_jsonl_writes_one_self_contained_line_per_rollout(store: SQLiteStore, tmp_path: Path) -> None:
    task, rollout = full_rollout()
    store.put_task(task)
    store.create_rollout(rollout, TOKEN_HASH)
    start_rollout(store, "r-other", step=8)
    store.mark_trained([rollout.id], step=7)
    out = tmp_path / "out" / "rollouts.jsonl"
    out.parent.mkdir()
    assert store.export_jsonl(out) == 2
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines] == ["r-full", "r-other"]
    rec = lines[0]
    assert TOKEN_HASH not in out.read_text(encoding="utf-8") and "token_hash" not in rec
    assert (rec["status"], rec["step"], rec["trained_step"], rec["total_reward"]) == ("completed", 7, 7, 0.25 + 1e-300)
    assert rec["turn_rewards"] == [0.5, -0.25, 1e-300] and rec["reward"] is None
    assert rec["task"] == {"id": "task-ü", "prompt": None, "messages": [dict(m) for m in task.messages],
                           "ground_truth": task.ground_truth, "split": "val", "data": dict(task.data)}
    for got, turn in zip(rec["turns"], rollout.turns):
        assert got["prompt_ids"] == list(turn.prompt_ids) and got["completion_ids"] == list(turn.completion_ids)
        assert got["logprobs"] == list(turn.logprobs)  # floats survive JSON exactly
        assert got["tool_calls"] == list(turn.tool_calls) and got["messages"] == list(turn.messages)
    assert rec["turns"][2]["break_reason"] == "history_rewritten"
    assert [c["arguments"] for c in rec["tool_calls"]] == [{"k": "A1"}, '{"k": bad']
    assert store.export_jsonl(out, step=8) == 1
    assert json.loads(out.read_text())["turns"] == []


# ---- durability -----------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from mtrl_runtime.store import SQLiteStore, hash_token
    from mtrl_runtime.types import Rollout, Task, Turn

    store = SQLiteStore(sys.argv[1])
    store.put_task(Task(id="t", prompt="p"))

    async def agent(w):
        await store.acreate_rollout(Rollout(id=f"r{w}", task_id="t", group_id="g"), hash_token("x"))
        prompt = tuple(range(300))
        for i in range(100000):
            turn = Turn(f"r{w}", i, (), prompt, (1, 2, 3), (-0.5, -0.25, -0.125), "stop", "abc")
            await store.aadd_turn(turn)
            print(f"r{w} {i}", flush=True)  # the response is 'sent' only after the commit
            prompt = prompt[-300:] + (9,)

    async def main():
        await asyncio.gather(*(agent(w) for w in range(8)))

    asyncio.run(main())
    """
)


def test_sigkill_loses_no_answered_turn(tmp_path: Path) -> None:
    db = tmp_path / "trajectories.db"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, str(script), str(db)], stdout=subprocess.PIPE, text=True, env=env)
    printed = []
    try:
        while len(printed) < 400:
            line = child.stdout.readline()
            assert line, f"child exited early with {child.wait()}"
            printed.append(line.split())
        child.send_signal(signal.SIGKILL)
        printed += [line.split() for line in child.stdout.read().splitlines() if line.strip()]
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with SQLiteStore(db) as store:
        for rollout_id, index in printed:
            turn = next((t for t in store.get_rollout(rollout_id).turns if t.index == int(index)), None)
            assert turn is not None, f"answered turn {rollout_id}/{index} lost"
            assert turn.logprobs == (-0.5, -0.25, -0.125)


def test_exports_only_public_names() -> None:
    import mtrl_runtime.store as store_pkg

    assert store_pkg.__all__ == ["STORES", "SQLiteStore", "TrajectoryStore", "hash_token", "open_store"]
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


# ---- benchmark (python tests/test_store.py bench) ---------------------------------------------


async def _bench(path: Path, writers: int = 32, rollouts_per_writer: int = 25, turns: int = 4) -> dict:
    store = SQLiteStore(path)
    store.put_task(Task(id="t", prompt="p"))
    latencies: list[float] = []

    async def writer(w: int) -> None:
        for k in range(rollouts_per_writer):
            rid = f"r{w}-{k}"
            await store.acreate_rollout(Rollout(id=rid, task_id="t", group_id=f"g{w}"), TOKEN_HASH)
            prompt = tuple((w * 7919 + j) % 49152 for j in range(300))
            messages = tuple({"role": "user", "content": "x" * 200} for _ in range(4))
            for i in range(turns):
                turn = make_turn(rid, i, prompt, n_completion=50, messages=messages)
                t0 = time.perf_counter()
                await store.aadd_turn(turn)
                latencies.append(time.perf_counter() - t0)
                prompt = prompt + turn.completion_ids + tuple(range(10))

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    store.close()
    latencies.sort()
    n = len(latencies)
    return {
        "turns": n,
        "turns_per_s": round(n / elapsed),
        "cpu_us_per_turn": round(1e6 * cpu / n),  # both threads; includes building the turns
        "p50_ms": round(1000 * latencies[n // 2], 2),
        "p99_ms": round(1000 * latencies[int(n * 0.99)], 2),
        "db_bytes_per_turn": round(sum(f.stat().st_size for f in path.parent.glob(path.name + "*")) / n),
    }


if __name__ == "__main__" and sys.argv[1:] == ["bench"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(_bench(Path(tmp) / "trajectories.db"))))
