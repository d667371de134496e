"""Regression tests for items 7-12 of an outside reliability probe (issue 47, "No silent loss"), against real parts.

Real coordinators served on 127.0.0.1 (real HTTP, the OpenAI SDK with its
own retries, raw sockets, ``mtrl serve`` as a subprocess), real SQLite
stores; the model is the shipped ``scripted`` engine. Each test failed on
the tree before its fix.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from _server_process import MTRL_SERVING, server_process
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.rollouts import Dispatcher, Heartbeat
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.store.memory import MemoryStore
from mtrl_runtime.types import Rollout, Task, ToolCall

ROOT = Path(__file__).resolve().parent.parent


def _config(**server: Any) -> MtrlConfig:
    return MtrlConfig.from_dict({"advanced": {"server": server}})


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _nested(levels: int) -> Any:
    """A JSON value ``levels`` deep: ``{"a": {"a": ... 1}}``."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def _turns(handle: Any, rollout: Any) -> int:
    return handle.store.count_turns(rollout.rollout_id)


# ------------------------------------------------------------------ 7. nothing stored for an answer that did not arrive


def test_an_sdk_call_with_deep_metadata_is_refused_once_and_stores_no_turn(served, tiny_tok):
    """Before: a 500 after the turn was stored; the SDK's two retries stored 3 turns the agent never saw."""
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}/v1", api_key=rollout.token,
                           max_retries=2)
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"x": _nested(300)}}}]
    for extra, field in (({"metadata": {"k": _nested(300)}}, "metadata.k"), ({"tools": tools}, "tools[0].parameters.properties.x")):
        with pytest.raises(openai.BadRequestError) as info:  # a 400 is final: no retry
            client.responses.create(model="m", input="hi", **extra)
        message = str(info.value)
        assert f"{field}.a" in message and "nested more than 64 levels deep" in message
        assert "advanced.server.max_json_depth" in message
        assert _turns(handle, rollout) == 0
    with httpx.stream("POST", f"{handle.url}/rollouts/{rollout.rollout_id}/v1/responses", headers=_bearer(rollout.token),
                      json={"model": "m", "input": "hi", "stream": True, "metadata": {"k": _nested(300)}}) as r:
        r.read()  # before: 200, then the connection dropped mid-stream
        assert r.status_code == 400 and "metadata.k" in r.json()["error"]["message"]
    assert _turns(handle, rollout) == 0
    assert client.responses.create(model="m", input="hi").output_text == "ok"  # the rollout goes on
    assert _turns(handle, rollout) == 1


CHAT_TURN = [{"role": "user", "content": "hi"}]


def _deep_bodies(levels: int) -> dict[str, tuple[str, dict[str, Any], str]]:
    """Per route: (path under the rollout, a body holding a value ``levels`` deep, the field the refusal names)."""
    deep = _nested(levels)
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": deep}
    return {
        "chat tool parameters": ("v1/chat/completions", {"messages": CHAT_TURN, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": deep}}]}, "tools[0].function.parameters"),
        "chat extra field": ("v1/chat/completions", {"messages": CHAT_TURN, "metadata": deep}, "metadata"),
        "responses metadata": ("v1/responses", {"input": "hi", "metadata": deep}, "metadata"),
        "messages tool input": ("v1/messages", {"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]},
            "messages[1].content[0].input"),
        "converse tool input": ("model/m/converse", {"messages": [
            {"role": "user", "content": [{"text": "hi"}]},
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": deep}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "r"}]}}]}]},
            "messages[1].content[0].toolUse.input"),
        "tool call report": ("tool_calls", {"name": "f", "arguments": deep}, "arguments"),
        "reward metrics": ("reward", {"reward": 0.5, "metrics": deep}, "metrics"),
    }


@pytest.mark.parametrize("route", list(_deep_bodies(1)))
def test_every_route_bounds_nesting_with_a_400_naming_the_field_and_serves_the_limit(served, tiny_tok, route):
    """Before: Messages and Converse answered 500 on deep tool input; nothing bounded nesting anywhere."""
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"), _config(max_json_depth=12))
    path, body, field = _deep_bodies(13)[route]  # 13 levels below the body: past the limit of 12
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    response = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/{path}", json=body,
                          headers=_bearer(rollout.token), timeout=30)
    assert response.status_code == 400, response.text
    assert response.headers["x-should-retry"] == "false"
    text = response.text
    assert field in text and "nested more than 12 levels deep" in text and "max_json_depth" in text
    stored = handle.store.get_rollout(rollout.rollout_id)
    assert (len(stored.turns), len(stored.tool_calls), stored.reward) == (0, 0, None)
    if route == "reward metrics":
        return  # metrics must be flat: no depth of them is served
    path, body, _ = _deep_bodies(12 - _DEPTH_ABOVE[route])[route]  # exactly at the limit: served
    response = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/{path}", json=body,
                          headers=_bearer(rollout.token), timeout=30)
    assert response.status_code == 200, response.text


# levels the body puts above each route's deep value (the body object is level 1)
_DEPTH_ABOVE = {"chat tool parameters": 4, "chat extra field": 1, "responses metadata": 1, "messages tool input": 5,
                "converse tool input": 6, "tool call report": 1}


def test_an_answer_that_cannot_be_written_records_no_turn(served, tiny_tok):
    """The commit is the last step that can fail: a model's tool call nested 300 deep cannot be written as
    Converse's ``toolUse.input`` (the JSON writer stops at 254 levels). Before: a 500 with the turn stored."""
    deep_call = ScriptedReply.tool_call("lookup", _nested(300))
    handle = served(ScriptedEngine(tiny_tok, [deep_call, "fine"]))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    body = {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "toolConfig": {"tools": [
        {"toolSpec": {"name": "lookup", "inputSchema": {"json": {"type": "object"}}}}]}}
    url = f"{handle.url}/rollouts/{rollout.rollout_id}/model/m/converse"
    failed = httpx.post(url, json=body, headers=_bearer(rollout.token), timeout=30)
    assert failed.status_code == 500 and "nothing was recorded" in failed.json()["message"], failed.text
    assert _turns(handle, rollout) == 0 and handle.coordinator.counters["answers_unwritable"] == 1
    retried = httpx.post(url, json=body, headers=_bearer(rollout.token), timeout=30)  # the client's retry
    assert retried.status_code == 200 and _turns(handle, rollout) == 1
    assert handle.store.get_rollout(rollout.rollout_id).turns[0].completion_text == "fine"


# ------------------------------------------------------------------ 8. one server setup: the header deadline in `mtrl serve`


def _closed_within(port: int, seconds: float) -> bool:
    """Whether a connection that never sends its headers is closed by the server within ``seconds``."""
    with socket.create_connection(("127.0.0.1", port)) as idle:
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # ... and never ends its headers
        idle.settimeout(seconds)
        try:
            return idle.recv(1024) == b""
        except TimeoutError:
            return False


def test_start_server_takes_the_header_deadline_from_the_config(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), _config(header_timeout_s=0.5))
    assert _closed_within(handle.port, 4)  # before: 10 s, whatever the config said


def _serve_args(tmp_path: Path, tiny_model_dir: Path, **server: Any) -> list[str]:
    import yaml

    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml.safe_dump({"core": {"model": str(tiny_model_dir), "engine": "scripted"},
                                   "advanced": {"server": server}}))
    return [sys.executable, "-m", "mtrl_runtime.cli", "serve", "--config", str(cfg), "--host", "127.0.0.1",
            "--port", "0", "--run-dir", str(tmp_path / "run")]


@pytest.mark.timeout(180)
def test_mtrl_serve_cuts_slow_headers_and_stops_on_ctrl_c_without_a_traceback(tmp_path, tiny_model_dir):
    """Before: `mtrl serve` ran uvicorn without the header deadline (connections held forever), and Ctrl-C
    printed uvicorn's KeyboardInterrupt traceback."""
    command = _serve_args(tmp_path, tiny_model_dir, header_timeout_s=0.5)
    with server_process(command, url_line=MTRL_SERVING, health="/health", timeout=120) as (server, url):
        port = int(url.rsplit(":", 1)[1])
        assert _closed_within(port, 4)
        assert httpx.get(f"{url}/health").status_code == 200  # a whole request is served as ever
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 130
        output = server.output()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "mtrl: stopped; the trajectories are in" in output, output


@pytest.mark.timeout(180)
def test_mtrl_online_stops_on_sigterm_with_status_130_and_no_traceback(tmp_path, tiny_model_dir):
    """`mtrl online` serves from a background thread, where uvicorn handles no signal: the main thread's wait is
    what SIGTERM (routed to Ctrl-C's KeyboardInterrupt by ``stop_on_sigterm``) ends; the service closes and one
    line names the store."""
    import yaml

    cfg = tmp_path / "online.yaml"
    cfg.write_text(yaml.safe_dump({"core": {"model": str(tiny_model_dir), "engine": "scripted",
                                            "run_dir": str(tmp_path / "run")}}))
    online_line = re.compile(r"^mtrl: online on (?P<url>http://\S+?)/v1 ")
    command = [sys.executable, "-m", "mtrl_runtime.cli", "online", str(cfg), "--port", "0"]
    with server_process(command, url_line=online_line, health="/health", timeout=120) as (server, url):
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 130, server.output()
        output = server.output()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "mtrl: stopped; the sessions and trajectories are in" in output, output


# ------------------------------------------------------------------ 9. tool calls per message; big bodies off the loop


def _calls(n: int, prefix: str = "c") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(n)]


def _many_calls_bodies(n: int) -> dict[str, tuple[str, dict[str, Any], list[str]]]:
    """Per protocol: (path, a body whose one assistant message holds ``n`` tool calls, words of its refusal)."""
    uses = [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}} for i in range(n)]
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "r"} for i in range(n)]
    return {
        "chat": ("v1/chat/completions", {"messages": [*CHAT_TURN, {"role": "assistant", "tool_calls": _calls(n)}]},
                 ["messages[1].tool_calls", f"{n} tool calls"]),
        "responses": ("v1/responses", {"input": [{"role": "user", "content": "hi"}, *({"type": "function_call", "call_id": f"c{i}", "name": "f",
                                                           "arguments": "{}"} for i in range(n))]},
                      ["input", f"{n} tool calls"]),
        "messages": ("v1/messages", {"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": uses},
            {"role": "user", "content": results}]}, ["messages", f"{n} tool calls"]),
        "converse": ("model/m/converse", {"messages": [
            {"role": "user", "content": [{"text": "hi"}]},
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": f"t{i}", "name": "f", "input": {}}}
                                              for i in range(n)]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": f"t{i}", "content": [{"text": "r"}]}}
                                         for i in range(n)]}]}, ["messages", f"{n} tool calls"]),
        "gemini": ("v1beta/models/m:generateContent", {"contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"functionCall": {"id": f"t{i}", "name": "f", "args": {}}} for i in range(n)]},
            {"role": "user", "parts": [{"functionResponse": {"id": f"t{i}", "name": "f", "response": {"output": "r"}}}
                                       for i in range(n)]}]}, ["contents", f"{n} tool calls"]),
    }


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "converse", "gemini"])
def test_tool_calls_per_message_are_bounded_with_a_400_naming_the_limit(served, tiny_tok, protocol):
    """Before: 10,000 calls in one message were served, the event loop frozen for seconds while they were."""
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"), _config(max_tool_calls=4, max_messages=8))
    path, body, words = _many_calls_bodies(5)[protocol]
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    url = f"{handle.url}/rollouts/{rollout.rollout_id}/{path}"
    response = httpx.post(url, json=body, headers=_bearer(rollout.token), timeout=30)
    assert response.status_code == 400, response.text
    assert response.headers["x-should-retry"] == "false"
    for word in [*words, "the limit is 4", "advanced.server.max_tool_calls"]:
        assert word in response.text, (word, response.text)
    assert _turns(handle, rollout) == 0
    path, body, _ = _many_calls_bodies(4)[protocol]  # at the limit: served
    assert httpx.post(url, json=body, headers=_bearer(rollout.token), timeout=30).status_code == 200
    assert _turns(handle, rollout) == 1


def test_a_large_request_under_every_limit_leaves_the_event_loop_serving(served, tiny_tok):
    """250 assistant messages of 128 tool calls (2.7 MB): before, the loop answered nobody for the whole call
    (1.5 s here; 40,000 calls froze it 9.3 s in the probe); now decoding, checking and building the prompt run on
    a worker thread, and a health check waits a fraction of it."""
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    messages: list[dict[str, Any]] = list(CHAT_TURN)
    for m in range(250):
        messages.append({"role": "assistant", "content": None, "tool_calls": _calls(128, f"m{m}-")})
        messages.append({"role": "tool", "tool_call_id": f"m{m}-0", "content": "r"})
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    waits: list[float] = []
    done = threading.Event()

    def health_checks() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                started = time.perf_counter()
                client.get(f"{handle.url}/health")
                waits.append(time.perf_counter() - started)
                time.sleep(0.01)

    checker = threading.Thread(target=health_checks)
    checker.start()
    time.sleep(0.2)
    started = time.perf_counter()
    try:
        response = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
                              json={"messages": messages}, headers=_bearer(rollout.token), timeout=120)
        total = time.perf_counter() - started
    finally:
        done.set()
        checker.join()
    assert response.status_code == 200 and _turns(handle, rollout) == 1, response.text
    assert max(waits) < total / 3, (max(waits), total)


# ------------------------------------------------------------------ 10. integers the store cannot keep


@pytest.mark.parametrize("route, body, field", [
    ("tool_calls", {"name": "f", "turn_index": 2**63}, "turn_index"),
    ("model_calls/batch", {"calls": [{"protocol": "openai", "input_tokens": 2**63}]}, "input_tokens"),
    ("model_calls/batch", {"calls": [{"protocol": "openai", "output_tokens": 2**64 - 1}]}, "output_tokens"),
])
def test_an_integer_past_64_bits_is_a_400_naming_the_field(served, tiny_tok, route, body, field):
    """Before: a 500 (SQLite keeps signed 64-bit integers) and a reset connection."""
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    response = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/{route}", json=body,
                          headers=_bearer(rollout.token))
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"] and str(body.get("turn_index") or
                                                                 body["calls"][0][field]) in response.text
    assert handle.store.get_rollout(rollout.rollout_id).tool_calls == ()
    largest = {**body, "turn_index": 2**63 - 1} if route == "tool_calls" else {
        "calls": [{"protocol": "openai", field: 2**63 - 1}]}
    assert httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/{route}", json=largest,
                      headers=_bearer(rollout.token)).status_code == 200


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_the_store_refuses_an_integer_past_64_bits_naming_the_field(tmp_path, backend):
    store = SQLiteStore(tmp_path / "t.db") if backend == "sqlite" else MemoryStore()
    try:
        store.put_task(Task(id="t", prompt="q"))
        store.create_rollout(Rollout(id="r1", task_id="t", group_id="g", created_at=time.time()), "0" * 64)
        with pytest.raises(ValueError, match=r"tool_call\.turn_index must be at most 2\*\*63-1"):
            store.add_tool_call(ToolCall(rollout_id="r1", name="f", arguments={}, turn_index=2**63))
    finally:
        store.close()


# ------------------------------------------------------------------ 11. an empty list of per-turn rewards


def test_empty_turn_rewards_are_refused_and_the_rollout_keeps_waiting_for_its_reward(served, tiny_tok):
    """Before: accepted; the rollout completed with no reward and without the reward_defaulted flag."""
    from mtrl_adapters._values import reward_report

    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    url = f"{handle.url}/rollouts/{rollout.rollout_id}"
    response = httpx.post(f"{url}/reward", json={"turn_rewards": []}, headers=_bearer(rollout.token))
    assert response.status_code == 400 and "turn_rewards is empty" in response.text, response.text
    assert response.json()["error"]["param"] == "turn_rewards"
    record = handle.store.get_rollout(rollout.rollout_id)
    assert (record.status.value, record.reward, record.turn_rewards) == ("running", None, None)
    with pytest.raises(ValueError, match="turn_rewards is empty"):  # update_reward([]) fails in the agent, unsent
        reward_report([], None)
    httpx.post(f"{url}/complete", json={"status": "completed"}, headers=_bearer(rollout.token))
    record = handle.store.get_rollout(rollout.rollout_id)  # no reward came: the default, flagged
    assert record.reward_defaulted and record.reward == handle.coordinator.config.advanced.default_reward


# ------------------------------------------------------------------ 12. smaller


def test_the_schema_declares_rollout_id_on_the_rollout_models_route(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    operation = httpx.get(f"{handle.url}/openapi.json").json()["paths"]["/rollouts/{rollout_id}/v1/models"]["get"]
    assert [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"] == ["rollout_id"]


def test_converse_refusals_say_not_to_retry(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    response = httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/model/m/converse", json={"messages": []},
                          headers=_bearer(rollout.token))
    assert response.status_code == 400 and response.headers["x-amzn-errortype"] == "ValidationException"
    assert response.headers["x-should-retry"] == "false"


def test_the_schema_and_docs_need_the_api_key_when_one_is_set(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), _config(api_key="sk-run"))
    for path in ("/openapi.json", "/docs", "/redoc"):
        refused = httpx.get(f"{handle.url}{path}")
        assert refused.status_code == 401 and "advanced.server.api_key" in refused.json()["error"]["message"]
        assert httpx.get(f"{handle.url}{path}", headers=_bearer("sk-wrong")).status_code == 401
        assert httpx.get(f"{handle.url}{path}", headers=_bearer("sk-run")).status_code == 200
    open_handle = served(ScriptedEngine(tiny_tok, ["ok"]))  # no key (loopback only): open as before
    assert httpx.get(f"{open_handle.url}/openapi.json").json()["openapi"].startswith("3.")
    assert httpx.get(f"{open_handle.url}/docs").status_code == 200


def test_a_reward_refused_in_a_run_is_said_in_the_runs_output(served, tiny_tok, caplog):
    """Before: an agent that carried on past its RolloutError (a framework's callback swallowing it) completed with
    the default reward, and nothing in the trainer's output said a reward had been refused."""
    from mtrl_adapters import RolloutError, update_reward

    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    config = MtrlConfig.from_dict({"core": {"group_size": 2}, "advanced": {
        "group_policy": {"on_failure": "keep_survivors", "min_survivors": 1}}})

    def agent(task: Any) -> str:
        try:
            update_reward(1.5)  # outside the default reward range [-1, 1]
        except RolloutError:
            pass
        return "done"

    async def collect() -> Any:
        executor = InProcessExecutor(agent)
        dispatcher = Dispatcher(handle.coordinator, executor, config, handle.url, handle.loop)
        beat = Heartbeat(dispatcher.tally, handle.coordinator.counters, lambda line: None)
        beat.mark("step 1/1", key=0)
        try:
            await dispatcher.collect(0, [Task(id="t", prompt="q")])
        finally:
            await executor.close()
        return beat.line()

    with caplog.at_level(logging.WARNING, logger="mtrl.coordinator"):
        line = asyncio.run(collect())
    said = [r.getMessage() for r in caplog.records if "reward report was refused" in r.getMessage()]
    assert len(said) == 1 and "1.5 is outside this run's reward range [-1, 1]" in said[0], said
    assert handle.coordinator.counters["rewards_refused"] == 2
    assert "rewards refused 2" in line, line
    assert all(r.reward_defaulted for r in handle.store.rollouts(with_turns=False))  # the run went on, flagged
