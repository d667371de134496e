"""Access control: loopback by default, API keys beyond it, one secret token per rollout, no secret leaks.

Real coordinators on 127.0.0.1; the headers and bodies the coordinator
receives are captured by a plain ASGI middleware in front of the app; the
store's SQLite files and the MLflow folder are read back as raw bytes.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from _faults import USER_API_KEY, FaultAgent, FaultPolicy, fault_task
from mtrl_runtime.config import MtrlConfig, ServerConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.server import check_bind, create_app, start_server
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.rollouts import Dispatcher
from mtrl_runtime.types import Task

COORDINATOR_KEY = "coordinator-api-key-do-not-leak-7f3a"


# ------------------------------------------------------------------ binding


def test_the_coordinator_binds_loopback_by_default(served, tiny_tok):
    assert ServerConfig().host == "127.0.0.1" and ServerConfig().api_key is None
    assert inspect.signature(start_server).parameters["host"].default == "127.0.0.1"
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    bound = [s.getsockname()[0] for server in handle.server.servers for s in server.sockets]
    assert bound == ["127.0.0.1"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.10", "10.0.0.1", "coordinator.example.com"])
def test_binding_beyond_loopback_without_an_api_key_is_refused(host):
    with pytest.raises(ValueError, match=r"not a loopback address; set advanced.server.api_key") as err:
        check_bind(host, None)
    assert repr(host) in str(err.value)
    check_bind(host, COORDINATOR_KEY)  # with a key it may bind there


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_addresses_need_no_api_key(host):
    check_bind(host, None)


def test_the_server_and_the_cli_refuse_an_open_bind_before_binding():
    app = object()  # never served: the check comes first
    with pytest.raises(ValueError, match="0.0.0.0"):
        start_server(app, "0.0.0.0", 0)  # type: ignore[arg-type]
    from mtrl_runtime.cli import main

    with pytest.raises(ValueError, match="api_key"):
        main(["serve", "--host", "0.0.0.0", "--engine", "scripted"])


def test_an_api_key_guards_rollout_creation_and_unattributed_calls(served, tiny_tok):
    config = MtrlConfig.from_dict({"advanced": {"server": {"api_key": COORDINATOR_KEY, "inference_mode": True}}})
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"), config)
    task = {"task_id": "t1", "prompt": "q"}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": COORDINATOR_KEY}):
        created = httpx.post(f"{handle.url}/v1/rollouts", json=task, headers=headers)
        assert created.status_code == 401 and "api key" in created.json()["error"]["message"]
        served_call = httpx.post(f"{handle.url}/v1/chat/completions", json=chat, headers=headers)
        assert served_call.status_code == 401 and "api key" in served_call.json()["error"]["message"]
    assert handle.store.rollouts() == []
    key = {"authorization": f"Bearer {COORDINATOR_KEY}"}
    assert httpx.post(f"{handle.url}/v1/rollouts", json=task, headers=key).status_code == 200
    assert httpx.post(f"{handle.url}/v1/chat/completions", json=chat, headers=key).status_code == 200


# ------------------------------------------------------------------ rollout ids and tokens


def test_rollout_ids_and_tokens_are_unguessable(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    made = [handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(300)]
    ids, tokens = [m.rollout_id for m in made], [m.token for m in made]
    assert len(set(ids)) == len(ids) and len(set(tokens)) == len(tokens)
    for rid in ids:
        assert re.fullmatch(r"r-[0-9a-f]{24}", rid), rid  # 96 random bits
    for token in tokens:
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token), token  # 256 random bits
        assert token not in "".join(ids)
    for position in range(2, 26):  # every hex digit of the id varies across rollouts: no counter, no clock
        assert len(Counter(rid[position] for rid in ids)) >= 12, position
    stored = {rid: handle.store.token_hash(rid) for rid in ids[:20]}
    assert all(stored[m.rollout_id] == hashlib.sha256(m.token.encode()).hexdigest() for m in made[:20])


def _snapshot(store: SQLiteStore, rollout_id: str) -> tuple:
    r = store.get_rollout(rollout_id)
    return (r.status, r.reward, r.turn_rewards, dict(r.metrics), r.error, len(r.turns), len(r.tool_calls))


_CHAT = {"messages": [{"role": "user", "content": "hi"}]}
_ROUTES = [  # (method, path under /rollouts/{id} or a full path, body, rollout id in a header?)
    ("POST", "/v1/chat/completions", _CHAT, False),
    ("POST", "@/v1/chat/completions", _CHAT, True),
    ("POST", "/tool_calls", {"name": "lookup", "arguments": {"key": "K1"}}, False),
    ("POST", "/tool_calls/batch", {"calls": [{"name": "lookup"}]}, False),
    ("POST", "/reward", {"reward": 0.9}, False),
    ("POST", "/complete", {"status": "failed", "error": "written by someone else"}, False),
    ("GET", "", None, False),
    ("POST", "@/update-reward", {"TrajectoryId": "{id}", "Rewards": [0.9]}, False),
    ("POST", "@/complete-rollout", {"TrajectoryId": "{id}", "Status": "FAILED"}, False),
]


def _request(handle: Any, rollout_id: str, route: tuple, headers: dict[str, str]) -> httpx.Response:
    method, path, body, by_header = route
    url = handle.url + path[1:] if path.startswith("@") else f"{handle.url}/rollouts/{rollout_id}{path}"
    if by_header:
        headers = {**headers, "x-mtrl-rollout-id": rollout_id}
    if isinstance(body, dict) and body.get("TrajectoryId") == "{id}":
        body = {**body, "TrajectoryId": rollout_id}
    return httpx.request(method, url, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("route", _ROUTES, ids=[f"{m} {p}" for m, p, _, _ in _ROUTES])
def test_only_a_rollouts_own_token_reaches_its_record(served, tiny_tok, route):
    config = MtrlConfig.from_dict({"advanced": {"server": {"sagemaker_compat": True}}})
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"), config)
    victim = handle.coordinator.create_rollout(Task(id="victim", prompt="q"))
    other = handle.coordinator.create_rollout(Task(id="other", prompt="q"))
    own = {"authorization": f"Bearer {victim.token}"}
    assert _request(handle, victim.rollout_id, _ROUTES[0], own).status_code == 200  # the victim has a turn
    before = _snapshot(handle.store, victim.rollout_id)

    credentials = [({}, 401), ({"authorization": "Bearer guess"}, 403),
                   ({"authorization": f"Bearer {other.token}"}, 403), ({"authorization": victim.token}, 401)]
    for headers, status in credentials:
        response = _request(handle, victim.rollout_id, route, headers)
        assert response.status_code == status, (headers, response.text)
        assert victim.rollout_id in response.json()["error"]["message"]
        assert other.token not in response.text and victim.token not in response.text
    assert _snapshot(handle.store, victim.rollout_id) == before
    assert handle.coordinator.counters["auth_rejected"] >= 2
    assert _request(handle, victim.rollout_id, route, own).status_code == 200  # its own token is accepted


def test_another_rollout_cannot_change_an_ended_rollouts_reward(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    done = handle.coordinator.create_rollout(Task(id="a", prompt="q"))
    other = handle.coordinator.create_rollout(Task(id="b", prompt="q"))
    base = f"{handle.url}/rollouts/{done.rollout_id}"
    own = {"authorization": f"Bearer {done.token}"}
    assert httpx.post(f"{base}/reward", json={"reward": 0.5}, headers=own).status_code == 200
    assert httpx.post(f"{base}/complete", json={"status": "completed"}, headers=own).status_code == 200
    stranger = {"authorization": f"Bearer {other.token}"}
    for path, body in [("/reward", {"reward": 0.5}), ("/reward", {"reward": 1.0}), ("/complete", {"status": "completed"})]:
        assert httpx.post(base + path, json=body, headers=stranger).status_code == 403  # not even a 409 hint
    stored = handle.store.get_rollout(done.rollout_id)
    assert (stored.reward, stored.status.value) == (0.5, "completed")


# ------------------------------------------------------------------ secrets never leak


class _Capture:
    """ASGI middleware that keeps every request's headers and body bytes (what the coordinator received)."""

    def __init__(self, app: Any, seen: list[tuple[dict[str, str], bytes]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        entry = (headers, bytearray())
        self.seen.append(entry)  # type: ignore[arg-type]

        async def tee() -> Any:
            message = await receive()
            entry[1].extend(message.get("body", b""))
            return message

        await self.app(scope, tee, send)


def _folder_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


async def test_the_users_key_and_rollout_tokens_never_leave_the_agent_or_reach_logs_store_or_mlflow(
    tmp_path, tiny_tok, caplog, capfd
):
    caplog.set_level(logging.DEBUG)  # every logger, every level: openai's, httpx's, uvicorn's, mtrl's
    run_dir = tmp_path / "run"
    config = MtrlConfig.from_dict({
        "core": {"group_size": 2, "max_turns": 4, "run_dir": str(run_dir)},
        "advanced": {"rollout_timeout_s": 20, "server": {"api_key": COORDINATOR_KEY}},
    })
    store = SQLiteStore(run_dir / "trajectories.db")
    coordinator = Coordinator(ScriptedEngine(tiny_tok, FaultPolicy()), store, config)
    seen: list[tuple[dict[str, str], bytes]] = []
    app = create_app(coordinator)
    app.add_middleware(_Capture, seen=seen)
    handle = start_server(app, "127.0.0.1", 0)
    agent = FaultAgent()
    executor = InProcessExecutor(agent)
    try:
        dispatcher = Dispatcher(coordinator, executor, config, handle.url, handle.loop)
        faults = ["healthy", "tool_raises", "agent_raises", "engine_fails", "never_reports"]
        batch = await dispatcher.collect(0, [fault_task(f) for f in faults])
        await agent.aclose()
        stranger = httpx.post(f"{handle.url}/rollouts/{batch.rollouts[0].id}/reward", json={"reward": 1.0},
                              headers={"authorization": "Bearer not-this-rollouts-token"})
        assert stranger.status_code == 403
    finally:
        await executor.close()
        handle.stop()

    # what the coordinator received: the rollout's token where the user's key was, never the key
    user_key = USER_API_KEY.encode()
    tokens: set[str] = set()
    for headers, body in seen:
        assert user_key not in body and all(USER_API_KEY not in v for v in headers.values()), headers
        assert "api-key" not in headers
        auth = headers.get("authorization", "").removeprefix("Bearer ")
        if auth and auth != "not-this-rollouts-token":
            tokens.add(auth)
    assert len(tokens) == len(batch.rollouts) == 10
    for rollout in batch.rollouts:
        assert coordinator.store.token_hash(rollout.id) in {hashlib.sha256(t.encode()).hexdigest() for t in tokens}

    # the store holds sha256 digests only: raw bytes of the database and its WAL, before and after close
    db_files = lambda: b"".join(p.read_bytes() for p in run_dir.glob("trajectories.db*"))  # noqa: E731
    secrets = [user_key, COORDINATOR_KEY.encode(), *(t.encode() for t in tokens)]
    for blob in (db_files(),):
        assert not [s for s in secrets if s in blob]
    rollouts = store.rollouts()
    store.close()
    blob = db_files()
    assert not [s for s in secrets if s in blob]
    assert all(hashlib.sha256(t.encode()).hexdigest().encode() in blob for t in tokens)

    # MLflow: params (the config), metrics and one trace per rollout
    import mlflow

    from mtrl_runtime.tracking import Tracker

    tracker = Tracker(config)
    # MLflow exports traces to the global tracking URI, not the client's: point it at the run's store for
    # this check (restored below), so the traces written are the ones read back.
    previous_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracker.tracking_uri)
    try:
        tracker.log_metrics(0, {"rollout/reward/mean": 0.5})
        tracker.log_rollouts(rollouts, step=0)
        tracker.flush()
        tracker.close()
    finally:
        mlflow.set_tracking_uri(previous_uri)
    assert tracker.trace_failures == 0
    mlflow_blob = _folder_bytes(run_dir / "mlartifacts") + (run_dir / "mlflow.db").read_bytes()
    assert b"lookup failed for K1" in mlflow_blob and b"<redacted>" in mlflow_blob  # the traces and params are there
    leaked = [s.decode()[:12] for s in secrets if s in mlflow_blob]
    assert not leaked, f"secrets written to MLflow: {leaked}"

    # logs and the process's output
    out, err = capfd.readouterr()
    text = caplog.text + out + err + json.dumps([r.getMessage() for r in caplog.records])
    assert caplog.records  # the run logged something (the checks below are not vacuous)
    leaked = [s.decode()[:12] for s in secrets if s.decode() in text]
    assert not leaked, f"secrets in logs: {leaked}"
