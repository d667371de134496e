"""Fuzz every route of the coordinator from its own OpenAPI schema, and check each request limit.

schemathesis reads ``/openapi.json`` from a coordinator served on 127.0.0.1
(SageMaker compatibility and inference mode on, so every route exists) and
sends each operation ``MAX_EXAMPLES`` generated requests, valid and invalid,
with a fixed seed. Half of the rollout-scoped requests name a real, fresh
rollout with its token, so the fuzzer gets past authentication into the
body checks and the engine. Every answer must come within ``CALL_TIMEOUT_S``,
be below 500, and every 4xx must carry ``error.message`` naming the fault.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import response_schema_conformance, status_code_conformance

from _groups import one_worker
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.server import create_app, start_server
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import Task

pytestmark = one_worker(__name__)  # the served coordinator and its parsed OpenAPI schema, built once

MAX_EXAMPLES = 20  # per operation and mode: 22 operations x positive, 18 POSTs x negative
SEED = 20260101
CALL_TIMEOUT_S = 10.0


def _policy(request: Any, prompt: str) -> ScriptedReply | str:
    """Alternate plain answers and tool calls, so both reply paths run under fuzzed prompts."""
    if request.turn_index % 2 == 0:
        return ScriptedReply.tool_call("lookup", {"key": "A1"}, text="Looking. ")
    return "The value is 42."


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, tiny_tok: Any) -> Iterator[Any]:
    config = MtrlConfig.from_dict(
        {"advanced": {"server": {"sagemaker_compat": True, "inference_mode": True}}}
    )
    store = SQLiteStore(tmp_path_factory.mktemp("fuzz") / "trajectories.db")
    coordinator = Coordinator(ScriptedEngine(tiny_tok, _policy), store, config)
    handle = start_server(create_app(coordinator), "127.0.0.1", 0)
    handle.coordinator = coordinator  # type: ignore[attr-defined]
    try:
        yield handle
    finally:
        handle.stop()
        store.close()
        report = os.environ.get("MTRL_FUZZ_REPORT")  # where to write the tally (docs/reliability.md figures)
        if report:
            Path(report).write_text(json.dumps({"total": sum(TALLY.values()), "by_outcome": dict(sorted(TALLY.items()))}, indent=1))


@pytest.fixture(scope="module")
def api_schema(fuzz_server: Any) -> Any:
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


OPERATIONS = [
    "POST /v1/chat/completions",
    "POST /rollouts/{rollout_id}/v1/chat/completions",
    "GET /v1/models",
    "GET /rollouts/{rollout_id}/v1/models",
    "GET /health",
    "POST /v1/rollouts",
    "POST /rollouts/{rollout_id}/tool_calls",
    "POST /rollouts/{rollout_id}/tool_calls/batch",
    "POST /rollouts/{rollout_id}/model_calls/batch",
    "POST /rollouts/{rollout_id}/reward",
    "POST /rollouts/{rollout_id}/complete",
    "GET /rollouts/{rollout_id}",
    "POST /complete-rollout",
    "POST /update-reward",
    # the protocols (server/protocols/), published with the request models their routes validate against
    "POST /v1/responses",
    "POST /rollouts/{rollout_id}/v1/responses",
    "POST /v1/messages",
    "POST /rollouts/{rollout_id}/v1/messages",
    "POST /model/{model_id}/converse",
    "POST /model/{model_id}/converse-stream",
    "POST /rollouts/{rollout_id}/model/{model_id}/converse",
    "POST /rollouts/{rollout_id}/model/{model_id}/converse-stream",
    *(f"POST {prefix}/{version}/models/{{model}}:{method}" for prefix in ("", "/rollouts/{rollout_id}")
      for version in ("v1beta", "v1") for method in ("generateContent", "streamGenerateContent")),
]
HEADER_ATTRIBUTED = {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/model/{model_id}/converse",
                     "/model/{model_id}/converse-stream",
                     *(f"/{v}/models/{{model}}:{m}" for v in ("v1beta", "v1")
                       for m in ("generateContent", "streamGenerateContent"))}
_turn = itertools.count()
TALLY: Counter[str] = Counter()  # "<operation> <mode> -> <status>": requests sent


def test_the_schema_is_published_and_lists_every_route(fuzz_server: Any, api_schema: Any) -> None:
    served = httpx.get(f"{fuzz_server.url}/openapi.json").json()
    assert served["openapi"].startswith("3.")
    labels = sorted(op.ok().label for op in api_schema.get_all_operations())
    assert labels == sorted(OPERATIONS)


def test_a_protocol_without_an_openapi_entry_cannot_be_served(monkeypatch: pytest.MonkeyPatch) -> None:
    from mtrl_runtime.server import protocols
    from mtrl_runtime.server.protocols import _openapi

    monkeypatch.setitem(protocols.PROTOCOLS, "new_protocol", ".openai_responses")
    with pytest.raises(ValueError, match=r"\['new_protocol'\] have no OpenAPI entry"):
        _openapi.openapi_paths()


def test_the_protocol_paths_are_documented_when_the_document_is_asked_for_and_checked_when_the_app_is_made(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_tok: Any) -> None:
    from mtrl_runtime.server import _app, protocols

    built: list[int] = []
    real = _app.protocol_openapi_paths
    monkeypatch.setattr(_app, "protocol_openapi_paths", lambda: built.append(1) or real())
    store = SQLiteStore(tmp_path / "store.db")
    try:
        app = create_app(Coordinator(ScriptedEngine(tiny_tok, ["hi"]), store, MtrlConfig()))
        assert built == []  # the request models' JSON schemas cost a coordinator start about 60 ms of CPU
        document = app.openapi()
        assert built == [1] and set(real()) <= set(document["paths"]) and app.openapi() is document
        monkeypatch.setitem(protocols.PROTOCOLS, "new_protocol", ".openai_responses")
        with pytest.raises(ValueError, match=r"\['new_protocol'\] have no OpenAPI entry"):
            create_app(Coordinator(ScriptedEngine(tiny_tok, ["hi"]), store, MtrlConfig()))
    finally:
        store.close()


def _aim_at_a_real_rollout(case: Any, handle: Any) -> None:
    """Every other case names a fresh live rollout and carries its token."""
    if next(_turn) % 2:
        return
    created = handle.coordinator.create_rollout(Task(id="fuzz", prompt="q"))
    headers = dict(case.headers or {})
    headers["authorization"] = f"Bearer {created.token}"
    if "rollout_id" in (case.path_parameters or {}):
        case.path_parameters = {**case.path_parameters, "rollout_id": created.rollout_id}
    elif case.operation.path in HEADER_ATTRIBUTED:
        headers["x-mtrl-rollout-id"] = created.rollout_id
    elif isinstance(case.body, dict) and "TrajectoryId" in case.body:
        case.body = {**case.body, "TrajectoryId": created.rollout_id}
    case.headers = headers


def _check(case: Any, handle: Any, mode: Any) -> None:
    _aim_at_a_real_rollout(case, handle)
    response = case.call(base_url=handle.url, timeout=CALL_TIMEOUT_S)
    label = case.operation.label
    TALLY[f"{label} {mode.value} -> {response.status_code}"] += 1
    assert response.status_code < 500, (label, response.status_code, response.text[:500], case.body)
    # the status is one the schema declares, and a 4xx body has the published error shape
    case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])
    if 400 <= response.status_code < 500:
        body = response.json()  # OpenAI's and Anthropic's shape: error.message; Bedrock's: message
        message = body["error"]["message"] if "error" in body else body["message"]
        assert len(message) > 10, (label, response.text[:500])


_CASES = [(label, GenerationMode.POSITIVE) for label in OPERATIONS] + [
    (label, GenerationMode.NEGATIVE) for label in OPERATIONS if label.startswith("POST")  # GETs have nothing to break
]


@pytest.mark.parametrize("label, mode", _CASES, ids=[f"{label} {mode.value}" for label, mode in _CASES])
def test_every_route_answers_below_500_and_names_every_4xx(label: str, mode: Any, fuzz_server: Any, api_schema: Any) -> None:
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, label

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(mode))
    def fuzz(case: Any) -> None:
        _check(case, fuzz_server, mode)

    fuzz()


@pytest.mark.parametrize("body, member", [
    ({"messages": [{"role": "user", "content": [{"text": "hi"}]}],
      "toolConfig": {"tools": [{"toolSpec": {"name": "t", "inputSchema": {"json": {}}}}], "toolChoice": {"tool": None}}},
     "toolChoice's tool is null"),
    ({"messages": [{"role": "user", "content": [{"text": None}]}]}, "content block's text is null"),
    ({"messages": [{"role": "user", "content": [{"text": "hi"}]}], "system": [{"text": None}]}, "system block's text is null"),
], ids=["tool-choice", "content-block", "system-block"])
def test_a_converse_union_member_sent_as_null_is_a_400_naming_it(fuzz_server: Any, body: Any, member: str) -> None:
    """Found by the fuzz: ``{"tool": null}`` passed as a one-member union and failed in the translation (a 500)."""
    created = fuzz_server.coordinator.create_rollout(Task(id="null-member", prompt="q"))
    response = httpx.post(f"{fuzz_server.url}/rollouts/{created.rollout_id}/model/m/converse", json=body,
                          headers={"authorization": f"Bearer {created.token}"}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.headers["x-amzn-errortype"] == "ValidationException"
    assert member in response.json()["message"]


# ---------------------------------------------------------------- request limits

LIMITS = {
    "core": {"sampling_params": {"max_tokens": 64}, "val_sampling_params": {"max_tokens": 64}},
    "advanced": {"server": {"max_body_bytes": 20000, "max_messages": 4, "max_tools": 2, "max_string_chars": 500,
                            "max_tool_calls": 2, "max_json_depth": 8, "max_tokens_over_cap": "refuse"}},
}


def _tool(name: str, description: str = "A tool.") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {"type": "object"}}}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def _user(n: int, chars: int = 2) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "x" * chars} for _ in range(n)]


def _calling(n: int) -> list[dict[str, Any]]:
    """A user message, then an assistant message with ``n`` tool calls."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "a", "arguments": "{}"}} for i in range(n)]
    return [*_user(1), {"role": "assistant", "content": None, "tool_calls": calls}]


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


# (route, body, status, words the message must hold); every body is just past one limit
OVER_LIMITS = {
    "messages per request": ("chat", _chat(messages=_user(5)), 400, ["messages", "5 messages", "limit is 4"]),
    "max_tokens": ("chat", _chat(max_tokens=65), 400, ["max_tokens", "65", "limit of 64"]),
    "max_completion_tokens": ("chat", _chat(max_completion_tokens=65), 400, ["max_tokens", "65", "limit of 64"]),
    "tools per request": ("chat", _chat(tools=[_tool("a"), _tool("b"), _tool("c")]), 400, ["tools", "3 tools", "limit is 2"]),
    "message content length": ("chat", _chat(messages=_user(1, 501)), 400, ["messages[0].content", "501", "limit is 500"]),
    "tool description length": ("chat", _chat(tools=[_tool("a", "d" * 501)]), 400, ["tools[0].function.description", "501"]),
    "content part length": (
        "chat", _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "p" * 501}]}]), 400,
        ["messages[0].content[0].text", "501", "limit is 500"],
    ),
    "key length": ("chat", _chat(metadata={"k" * 501: 1}), 400, ["a key of 501 characters"]),
    "tool calls per message": ("chat", _chat(messages=_calling(3)), 400,
                               ["messages[1].tool_calls", "3 tool calls", "limit is 2"]),
    "nesting depth": ("chat", _chat(metadata=_nested(8)), 400, ["metadata.a", "nested more than 8 levels", "limit is 8"]),
    "nesting depth of a report": ("tool_calls", {"name": "lookup", "arguments": _nested(8)}, 400,
                                  ["arguments.a", "nested more than 8 levels"]),
    "completions per request (n)": ("chat", _chat(n=2), 400, ["n", "2"]),
    "stop strings": ("chat", _chat(stop=[str(i) for i in range(17)]), 400, ["stop", "16"]),
    "top_logprobs": ("chat", _chat(logprobs=True, top_logprobs=21), 400, ["top_logprobs", "21"]),
    "tool result length": ("tool_calls", {"name": "lookup", "result": "r" * 501}, 400, ["result", "501", "limit is 500"]),
    "tool call batch body size": ("tool_calls/batch", {"calls": [{"name": "t"}] * 10001}, 413, ["bytes"]),
    "tool name length": ("tool_calls", {"name": "n" * 257}, 400, ["name", "256"]),
    "error text length": ("complete", {"status": "failed", "error": "e" * 501}, 400, ["error", "501"]),
    "turn rewards length": ("reward", {"turn_rewards": [0.0] * 3}, 400, ["turn_rewards", "3 values", "0 turns"]),
    "body size": ("chat", _chat(messages=_user(4, 400), padding=["p" * 400] * 50), 413, ["bytes", "limit is 20000"]),
}


@pytest.fixture
def limited(served: Any, tiny_tok: Any) -> Any:
    return served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"), MtrlConfig.from_dict(LIMITS))


def _post(handle: Any, rollout: Any, route: str, body: Any = None, **kw: Any) -> httpx.Response:
    path = "v1/chat/completions" if route == "chat" else route
    auth = {"authorization": f"Bearer {rollout.token}"}
    return httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/{path}", json=body, headers=auth, timeout=30, **kw)


@pytest.mark.parametrize("limit", list(OVER_LIMITS))
def test_each_request_limit_is_refused_clearly_and_changes_nothing(limited: Any, limit: str) -> None:
    route, body, status, words = OVER_LIMITS[limit]
    rollout = limited.coordinator.create_rollout(Task(id="t", prompt="q"))
    response = _post(limited, rollout, route, body)
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    for word in words:
        assert word in message, (word, message)
    stored = limited.store.get_rollout(rollout.rollout_id)
    assert (len(stored.turns), len(stored.tool_calls), stored.reward, stored.status.value) == (0, 0, None, "running")
    assert _post(limited, rollout, "chat", _chat()).status_code == 200  # the rollout goes on


def test_a_body_over_the_limit_without_content_length_is_refused(limited: Any) -> None:
    rollout = limited.coordinator.create_rollout(Task(id="t", prompt="q"))

    def chunks() -> Iterator[bytes]:  # chunked transfer: the size is only known while reading
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"}]}'

    response = httpx.post(
        f"{limited.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
        content=chunks(),
        headers={"authorization": f"Bearer {rollout.token}", "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413 and "exceeds the limit of 20000 bytes" in response.json()["error"]["message"]
    assert limited.store.count_turns(rollout.rollout_id) == 0


def test_requests_at_each_limit_are_served(limited: Any) -> None:
    rollout = limited.coordinator.create_rollout(Task(id="t", prompt="q"))
    body = _chat(messages=_user(4, 500), tools=[_tool("a", "d" * 500), _tool("b")], max_tokens=64)
    response = _post(limited, rollout, "chat", body)
    assert response.status_code == 200, response.text
    body = _chat(messages=_calling(2), tools=[_tool("a")], metadata=_nested(7))  # 2 calls; the body 8 levels deep
    assert _post(limited, rollout, "chat", body).status_code == 200
    assert _post(limited, rollout, "tool_calls", {"name": "n" * 256, "result": "r" * 500}).status_code == 200
    assert limited.store.count_turns(rollout.rollout_id) == 2 and limited.store.count_tool_calls(rollout.rollout_id) == 1
