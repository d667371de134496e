"""Regression tests for the holes an outside probe found (issue 19), each against real parts.

Real coordinators served on 127.0.0.1 (real HTTP, raw sockets for half-sent
requests), real SQLite stores, the tiny model for the update; the model is
the shipped ``scripted`` engine. Each test failed on the tree before the fix.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import math
import socket
import time

import httpx
import pytest
import torch

from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.coordinator import Coordinator, RolloutLife
from mtrl_runtime.diagnostics import NONFINITE_SKIPPED, diagnose
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.errors import BadRequest
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.store.memory import MemoryStore
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy
from mtrl_runtime.types import Abandoned, Rollout, RolloutStatus, Sample, SamplingParams, Task

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _config(**server):
    return MtrlConfig.from_dict({"advanced": {"server": server}})


def _open(handle, task_id="t1", prompt="q", headers=None, **extra):
    return httpx.post(f"{handle.url}/v1/rollouts", json={"task_id": task_id, "prompt": prompt, **extra},
                      headers=headers or {})


def _bearer(token):
    return {"authorization": f"Bearer {token}"}


def _error(response):
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# ------------------------------------------------------------------ 1. rewards: a declared range; nothing non-finite reaches the weights


def test_a_reward_outside_the_range_is_a_400_naming_value_and_range_and_nothing_is_stored(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    created = _open(handle).json()
    url, auth = f"{handle.url}/rollouts/{created['rollout_id']}/reward", _bearer(created["token"])
    for body, param in (({"reward": 1.7e308}, "reward"), ({"reward": -1.5}, "reward"),
                        ({"reward": 1e6 + 1}, "reward")):
        response = httpx.post(url, json=body, headers=auth)
        error = _error(response)
        assert response.status_code == 400 and error["param"] == param, response.text
        assert repr(body["reward"]) in error["message"] and "[-1, 1]" in error["message"]
        assert "advanced.reward_range" in error["message"]
    record = handle.store.get_rollout(created["rollout_id"])
    assert (record.status, record.reward, record.turn_rewards) == (RolloutStatus.RUNNING, None, None)
    assert httpx.post(url, json={"reward": 1.0}, headers=auth).status_code == 200
    assert handle.store.get_rollout(created["rollout_id"]).reward == 1.0


def test_the_reward_range_is_configurable_with_a_bound_always_on(served, tiny_tok):
    config = MtrlConfig.from_dict({"advanced": {"reward_range": [0, 10]}})
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), config)
    created = _open(handle).json()
    url, auth = f"{handle.url}/rollouts/{created['rollout_id']}/reward", _bearer(created["token"])
    assert httpx.post(url, json={"reward": 7.5}, headers=auth).status_code == 200
    for bad in ([0, 1e308], [0, math.inf], [1, 0], [math.nan, 1]):
        with pytest.raises(ConfigError, match="reward_range"):
            MtrlConfig.from_dict({"advanced": {"reward_range": bad}})
    with pytest.raises(ConfigError, match="default_reward 2.0 is outside reward_range"):
        MtrlConfig.from_dict({"advanced": {"default_reward": 2.0}})


def test_a_huge_reward_metric_is_refused(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    created = _open(handle).json()
    response = httpx.post(f"{handle.url}/rollouts/{created['rollout_id']}/reward", headers=_bearer(created["token"]),
                          json={"reward": 1.0, "metrics": {"acc": 1.7e308}})
    assert response.status_code == 400 and "metrics['acc']" in _error(response)["message"]
    assert handle.store.get_rollout(created["rollout_id"]).reward is None


def _policy_update():
    tok = tiny_tokenizer()
    return PolicyUpdate(build_policy(tiny_model(tok, seed=0), tok, rank=4, alpha=8), UpdateSettings(precision="fp32")), tok


def _sample(tok, rollout_id, advantage):
    ids = tuple(tok("the answer is 42 and then DONE")["input_ids"])
    mask = (0,) * 3 + (1,) * (len(ids) - 3)
    return Sample(rollout_id=rollout_id, group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
                  behaviour_logprobs_T=tuple(-1.0 if m else 0.0 for m in mask),
                  advantages_T=tuple(advantage if m else 0.0 for m in mask),
                  policy_version_T=tuple(0 if m else -1 for m in mask))


def _weights(update):
    return [p.detach().clone() for p in update.policy.trainable_parameters()]


def test_a_nan_gradient_skips_the_step_and_leaves_the_weights_finite(caplog):
    update, tok = _policy_update()
    before = _weights(update)
    param = next(iter(update.policy.trainable_parameters()))
    hook = param.register_hook(lambda grad: torch.full_like(grad, math.nan))  # a planted NaN gradient
    with caplog.at_level(logging.WARNING, logger="mtrl.train"):
        metrics = update.step([_sample(tok, "r-poisoned", 1.0)])
    hook.remove()
    assert metrics[NONFINITE_SKIPPED] == 1.0 and update.version == 0 and update.skipped_nonfinite == 1
    assert all(math.isfinite(v) for v in metrics.values()), metrics  # the metrics commit refuses anything else
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(update)))
    assert update.weights_finite()
    assert "non-finite gradients" in caplog.text and "r-poisoned" in caplog.text
    assert update.step([_sample(tok, "r-fine", 1.0)]).get(NONFINITE_SKIPPED) is None  # the next step trains
    assert update.version == 1 and update.weights_finite()


@pytest.mark.parametrize("advantage", [math.inf, math.nan, 1.7e308 * 10])
def test_a_non_finite_advantage_skips_the_step_naming_the_rollout(caplog, advantage):
    update, tok = _policy_update()
    before = _weights(update)
    with caplog.at_level(logging.WARNING, logger="mtrl.train"):
        metrics = update.step([_sample(tok, "r-fine", 1.0), _sample(tok, "r-huge", advantage)])
    assert metrics[NONFINITE_SKIPPED] == 1.0 and update.version == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(update)))
    assert "non-finite advantages" in caplog.text and "r-huge" in caplog.text and "r-fine" not in caplog.text


def test_the_diagnostics_name_a_skipped_non_finite_step():
    found = diagnose([{"step": 0, NONFINITE_SKIPPED: 0.0}, {"step": 1, NONFINITE_SKIPPED: 1.0}],
                     rules=["nonfinite_update_skipped"])
    assert [d.rule for d in found] == ["nonfinite_update_skipped"] and "steps 1" in found[0].message
    assert diagnose([{"step": 0, "rollout/reward/mean": 0.5}], rules=["nonfinite_update_skipped"]) == []


def test_no_checkpoint_is_written_from_non_finite_weights_and_resume_takes_the_last_finite_one(tmp_path):
    from mtrl_runtime.training._checkpoint import Checkpoints
    from mtrl_runtime.training.update import NonFiniteWeights

    update, tok = _policy_update()
    with SQLiteStore(tmp_path / "trajectories.db") as store:
        checkpoints = Checkpoints(tmp_path, store, keep=3)
        checkpoints.save(2, update, {"epoch": 0, "index": 2})
        finite = _weights(update)
        with torch.no_grad():
            next(iter(update.policy.trainable_parameters())).fill_(math.nan)
        with pytest.raises(NonFiniteWeights, match="non-finite weights"):
            checkpoints.save(4, update, {"epoch": 0, "index": 4})
        assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]
        update.weights_finite = lambda: True  # a checkpoint written by an older mtrl, which did not look
        checkpoints.save(4, update, {"epoch": 0, "index": 4})
        del update.weights_finite
        resumed, _ = _policy_update()
        state = Checkpoints(tmp_path, store, keep=3).restore(resumed)
        assert state.next_step == 2 and resumed.weights_finite()
        assert all(torch.equal(a, b) for a, b in zip(finite, _weights(resumed)))
        names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert names[0].startswith(".step-000004.nonfinite-") and names[1:] == ["step-000002"]  # kept aside


# ------------------------------------------------------------------ 2. stored tasks are immutable; who may open rollouts


def test_a_stored_task_is_immutable_and_the_same_content_is_idempotent(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    assert _open(handle, prompt="original", ground_truth=4).status_code == 200
    assert _open(handle, prompt="original", ground_truth=4).status_code == 200  # same content: fine
    for change in ({"prompt": "rewritten", "ground_truth": 4}, {"prompt": "original", "ground_truth": 5},
                   {"prompt": "original", "ground_truth": 4, "data": {"x": 1}}):
        response = _open(handle, **change)
        assert response.status_code == 409 and "task_id 't1'" in _error(response)["message"], response.text
    task = handle.store.get_task("t1")
    assert (task.prompt, task.ground_truth, dict(task.data)) == ("original", 4, {})
    assert len(handle.store.rollouts(with_turns=False)) == 2  # the refused ones opened nothing
    with pytest.raises(Exception, match="task_id 't1' is already stored"):  # the dispatcher's path too
        handle.coordinator.create_rollout(Task(id="t1", prompt="changed mid-run"))


def test_training_mode_refuses_unattributed_rollout_creation_unless_allowed(served, tiny_tok):
    refused = served(ScriptedEngine(tiny_tok, ["ok"]), _config(training_mode=True))
    response = _open(refused)
    assert response.status_code == 403 and "allow_external_rollouts" in _error(response)["message"]
    assert refused.store.rollouts(with_turns=False) == [] and refused.store.get_task("t1") is None
    allowed = served(ScriptedEngine(tiny_tok, ["ok"]), _config(training_mode=True, allow_external_rollouts=True,
                                                               api_key="k"))
    assert _open(allowed).status_code == 401  # the API key still applies
    assert _open(allowed, headers=_bearer("k")).status_code == 200


def test_the_api_key_is_compared_in_constant_time(served, tiny_tok, monkeypatch):
    import hmac

    from mtrl_runtime.server import _http

    seen = []
    real = hmac.compare_digest
    monkeypatch.setattr(_http.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), _config(api_key="the-key", inference_mode=True))
    assert _open(handle, headers=_bearer("the-kez")).status_code == 401
    assert httpx.post(f"{handle.url}/v1/chat/completions", json=CHAT, headers=_bearer("nope")).status_code == 401
    assert _open(handle, headers=_bearer("the-key")).status_code == 200
    assert (b"the-kez", b"the-key") in seen and (b"nope", b"the-key") in seen and (b"the-key", b"the-key") in seen


# ------------------------------------------------------------------ 3. context length


def test_a_prompt_over_the_context_is_a_400_naming_both_numbers_never_an_engine_failure(served, tiny_tok):
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: "ok", context_length=64)
    handle = served(engine)
    created = _open(handle).json()
    url, auth = f"{handle.url}/rollouts/{created['rollout_id']}/v1/chat/completions", _bearer(created["token"])
    long = {"messages": [{"role": "user", "content": "word " * 200}]}
    response = httpx.post(url, json=long, headers=auth)
    error = _error(response)
    assert response.status_code == 400 and response.headers["x-should-retry"] == "false", response.text
    assert "the model's context is 64 tokens" in error["message"] and error["param"] == "messages"
    assert error["type"] == "invalid_request"
    prompt_tokens = int(error["message"].split("rendered prompt is ")[1].split()[0])
    assert prompt_tokens > 64
    response = httpx.post(url, json={**CHAT, "max_tokens": 60}, headers=auth)  # fits alone, not with max_tokens
    error = _error(response)
    assert response.status_code == 400 and "+ max_tokens 60" in error["message"] and error["param"] == "max_tokens"
    assert engine.calls == 0 and handle.coordinator.counters["engine_failures"] == 0
    assert handle.store.get_rollout(created["rollout_id"]).turns == ()  # nothing recorded as a turn
    ok = httpx.post(url, json=CHAT, headers=auth)  # the run's default max_tokens is shortened to fit, as before
    assert ok.status_code == 200, ok.text
    assert engine.calls == 1 and handle.coordinator.counters["engine_failures"] == 0


def test_a_bad_tool_definition_is_a_400_naming_the_tool_and_nothing_is_recorded(served, tiny_tok):
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: "ok")
    handle = served(engine)
    created = _open(handle).json()
    url, auth = f"{handle.url}/rollouts/{created['rollout_id']}/v1/chat/completions", _bearer(created["token"])
    tools = [{"type": "function", "function": {"name": "lookup"}}, {"type": "function", "function": {"name": ""}}]
    response = httpx.post(url, json={**CHAT, "tools": tools}, headers=auth)
    error = _error(response)
    assert response.status_code == 400, response.text
    assert "tools.1.function.name" in error["message"] and "(got '')" in error["message"]
    # a caller in the process (no HTTP schema in between) is refused the same way, before anything is recorded
    call = handle.coordinator.chat(created["rollout_id"], created["token"], CHAT["messages"],
                                   [{"type": "web_search"}], SamplingParams())
    with pytest.raises(BadRequest, match=r"tools\[0\]: only function tools are supported") as refused:
        asyncio.run_coroutine_threadsafe(call, handle.loop).result(30)
    assert refused.value.param == "tools"
    assert engine.calls == 0 and handle.store.get_rollout(created["rollout_id"]).turns == ()
    assert httpx.post(url, json={**CHAT, "tools": tools[:1]}, headers=auth).status_code == 200


def test_the_agent_records_a_context_overflow_as_its_own_error(served, tiny_tok):
    import openai

    from _adapter_support import specs
    from mtrl_adapters import rollout

    engine = ScriptedEngine(tiny_tok, lambda request, prompt: "ok", context_length=64)
    handle = served(engine)

    @rollout
    async def agent(task):
        client = openai.AsyncOpenAI(base_url="https://provider.invalid/v1", api_key="sk-user")
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])

    from mtrl_runtime.executors import InProcessExecutor

    [spec] = specs(handle, [Task(id="long", prompt="word " * 200)])
    outcome = asyncio.run(InProcessExecutor(agent).run(spec))
    record = handle.store.get_rollout(spec.rollout_id)
    assert record.status is RolloutStatus.FAILED and outcome.status is RolloutStatus.FAILED
    assert "BadRequestError" in record.error and "context is 64 tokens" in record.error
    assert "engine" not in record.error.split("\n")[0]
    assert engine.calls == 0 and handle.coordinator.counters["engine_failures"] == 0


# ------------------------------------------------------------------ 4. SageMaker-compat tokens are verified


def _forged_sigv4(key_id="AKIDFORGED"):
    query = ("Action=CallWithBearerToken&X-Amz-Algorithm=AWS4-HMAC-SHA256"
             f"&X-Amz-Credential={key_id}%2F{time.strftime('%Y%m%d', time.gmtime())}%2Flocal%2Fsagemaker%2Faws4_request"
             f"&X-Amz-Date={time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}&X-Amz-Expires=3600"
             "&X-Amz-SignedHeaders=host&X-Amz-Signature=" + "0" * 64 + "&Version=1")
    return "sagemaker-api-key-" + base64.b64encode(f"sagemaker.amazonaws.com/?{query}".encode()).decode()


@pytest.mark.parametrize("credentials", [{}, {"sagemaker_access_key_id": "AKIDFORGED", "sagemaker_secret": "s3cret"}])
def test_a_forged_sigv4_token_writes_nothing(served, tiny_tok, credentials):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), _config(sagemaker_compat=True, **credentials))
    made = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    forged = _bearer(_forged_sigv4())
    calls = [
        ("/v1/chat/completions", CHAT, {"x-amzn-sagemaker-trajectory-id": made.rollout_id}),
        ("/update-reward", {"TrajectoryId": made.rollout_id, "Rewards": [1.0]}, {}),
        ("/complete-rollout", {"TrajectoryId": made.rollout_id, "Status": "COMPLETED"}, {}),
        (f"/rollouts/{made.rollout_id}/reward", {"reward": 1.0}, {}),
    ]
    for path, body, extra in calls:
        response = httpx.post(handle.url + path, json=body, headers={**forged, **extra})
        assert response.status_code in (401, 403), (path, response.text)
    record = handle.store.get_rollout(made.rollout_id)
    assert (record.status, record.reward, len(record.turns)) == (RolloutStatus.RUNNING, None, 0)
    assert handle.coordinator.counters["compat_sigv4_accepted"] == 0


def test_sigv4_signatures_are_checked_against_the_configured_secret():
    pytest.importorskip("botocore")
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from mtrl_runtime.server._sigv4 import signature_problem

    request = AWSRequest(method="POST", url="https://sagemaker.amazonaws.com/", headers={"host": "sagemaker.amazonaws.com"},
                         params={"Action": "CallWithBearerToken"})
    SigV4QueryAuth(Credentials("AKIDREAL", "real-secret"), "sagemaker", "local", expires=600).add_auth(request)
    url = request.url.replace("https://", "") + "&Version=1"
    assert signature_problem(url, "AKIDREAL", "real-secret") is None
    assert "signature does not match" in signature_problem(url, "AKIDREAL", "other-secret")
    assert "access key" in signature_problem(url, "AKIDOTHER", "real-secret")
    assert "signature does not match" in signature_problem(url.replace("Expires=600", "Expires=601"), "AKIDREAL",
                                                           "real-secret")


# ------------------------------------------------------------------ 5. the token before the body; half-open requests; hang-ups


def test_the_token_is_checked_before_the_body_is_read(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    made = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    base = f"{handle.url}/rollouts/{made.rollout_id}"
    garbage = {"not": "a valid body", "reward": "yes"}
    for path in ("/reward", "/tool_calls", "/tool_calls/batch", "/complete", "/v1/chat/completions"):
        assert httpx.post(base + path, json=garbage).status_code == 401, path
        response = httpx.post(base + path, json=garbage, headers=_bearer("guess"))
        assert response.status_code == 403 and "schema" not in response.text and "reward" not in response.text
    response = httpx.post(base + "/reward", json=garbage, headers=_bearer(made.token))
    assert response.status_code == 400  # the rollout's own agent is told what is wrong


def _half_open(port, path="/v1/rollouts", sent=b'{"task_id": '):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 f"content-length: 100\r\n\r\n".encode() + sent)
    return sock


def _status_line(sock, timeout):
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        return None
    return data.split(b"\r\n", 1)[0].decode() if data else ""


def test_half_sent_bodies_time_out_and_are_bounded_in_number(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), _config(body_timeout_s=1.0, max_pending_bodies=8))
    started = time.monotonic()
    socks = [_half_open(handle.port) for _ in range(8)]
    time.sleep(0.3)  # all eight are now waiting for the rest of their bodies
    extra = _half_open(handle.port)
    assert "503" in (_status_line(extra, 5) or ""), "a ninth half-open request is refused at once"
    lines = [_status_line(s, 10) for s in socks]
    elapsed = time.monotonic() - started
    assert all(line is not None and "408" in line for line in lines), lines
    assert elapsed < 6, elapsed
    for s in socks + [extra]:
        s.close()
    assert _open(handle).status_code == 200  # the server serves on
    assert handle.store.get_task("t1") is not None and len(handle.store.rollouts(with_turns=False)) == 1


def test_a_client_hang_up_is_one_log_line_not_a_traceback(served, tiny_tok, caplog):
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep = Keep(level=logging.DEBUG)
    watched = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "mtrl.server")]
    for logger in watched:
        logger.addHandler(keep)
    old_level = logging.getLogger("mtrl.server").level
    logging.getLogger("mtrl.server").setLevel(logging.INFO)
    try:
        handle = served(ScriptedEngine(tiny_tok, ["ok"]))
        made = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
        for path in ("/v1/rollouts", f"/rollouts/{made.rollout_id}/v1/chat/completions"):
            sock = _half_open(handle.port, path)
            if "chat" in path:  # the hot route reads the body after the token: send a valid one
                sock.close()
                sock = socket.create_connection(("127.0.0.1", handle.port))
                sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {made.token}\r\n"
                             "content-length: 100\r\n\r\n{\"mess".encode())
            time.sleep(0.2)
            sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len([r for r in records if r.name == "mtrl.server"]) < 1:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        for logger in watched:
            logger.removeHandler(keep)
        logging.getLogger("mtrl.server").setLevel(old_level)
    assert not [r for r in records if r.exc_info or "Traceback" in r.getMessage()], [r.getMessage() for r in records]
    lines = [r.getMessage() for r in records if r.name == "mtrl.server"]
    assert len(lines) >= 1 and all("hung up" in line and "\n" not in line for line in lines), lines


def test_slow_or_missing_headers_are_cut_at_the_header_deadline(tiny_tok):
    """uvicorn bounds no header-read time: mtrl's protocol closes a connection whose headers do not arrive."""
    from mtrl_runtime.server import create_app, start_server

    coordinator = Coordinator(ScriptedEngine(tiny_tok, ["ok"]), MemoryStore())
    handle = start_server(create_app(coordinator), "127.0.0.1", 0, header_timeout_s=0.5)
    try:
        idle = socket.create_connection(("127.0.0.1", handle.port))  # connects, sends nothing
        slow = socket.create_connection(("127.0.0.1", handle.port))
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # ... and never ends its headers
        started = time.monotonic()
        for sock in (idle, slow):
            sock.settimeout(5)
            assert sock.recv(1024) == b""  # closed by the server, not left open
            sock.close()
        assert time.monotonic() - started < 4
        kept = socket.create_connection(("127.0.0.1", handle.port))  # a whole request is answered as ever
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        kept.settimeout(5)
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        kept.close()
        assert httpx.get(handle.url + "/health").status_code == 200
    finally:
        handle.stop()


# ------------------------------------------------------------------ 6. serve-mode TTL; large tool-call batches


def test_idle_rollouts_are_abandoned_after_the_ttl_and_kept_in_the_store(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]), _config(rollout_ttl_s=0.6))
    idle = _open(handle, task_id="idle").json()
    busy = _open(handle, task_id="busy").json()
    busy_url = f"{handle.url}/rollouts/{busy['rollout_id']}/tool_calls"
    deadline = time.monotonic() + 10
    while idle["rollout_id"] in handle.coordinator.live_rollout_ids() and time.monotonic() < deadline:
        httpx.post(busy_url, json={"name": "ping"}, headers=_bearer(busy["token"]))  # keeps it alive
        time.sleep(0.1)
    record = handle.store.get_rollout(idle["rollout_id"])
    assert record.status is RolloutStatus.ABANDONED and "rollout_ttl_s=0.6" in record.error
    assert record.reward_defaulted
    assert handle.coordinator.live_rollout_ids() == [busy["rollout_id"]]
    assert handle.store.get_rollout(busy["rollout_id"]).status is RolloutStatus.RUNNING
    late = httpx.post(f"{handle.url}/rollouts/{idle['rollout_id']}/v1/chat/completions", json=CHAT,
                      headers=_bearer(idle["token"]))
    assert late.status_code == 409 and "abandoned" in _error(late)["message"]


def test_abandoned_is_a_final_status_of_the_state_machine_and_both_stores(tmp_path):
    ending = RolloutLife().decide(Abandoned(30.0))
    assert ending.status is RolloutStatus.ABANDONED and ending.default_reward and "30" in ending.error
    for store in (MemoryStore(tmp_path / "m"), SQLiteStore(tmp_path / "s.db")):
        store.put_task(Task(id="t", prompt="q"))
        store.create_rollout(Rollout(id="r1", task_id="t", group_id="g", created_at=time.time()), "0" * 64)
        assert store.finish_rollout("r1", "abandoned", "idle")
        assert not store.finish_rollout("r1", RolloutStatus.COMPLETED)
        assert [r.id for r in store.rollouts(status="abandoned", with_turns=False)] == ["r1"]
        store.close()


def test_a_large_tool_call_batch_does_not_block_the_event_loop(tmp_path, tiny_tok):
    from mtrl_adapters.wire import ToolCallReport

    async def main():
        with SQLiteStore(tmp_path / "t.db") as store:
            coordinator = Coordinator(ScriptedEngine(tiny_tok, ["ok"]), store)
            made = coordinator.create_rollout(Task(id="t", prompt="q"))
            calls = [ToolCallReport(name="lookup", arguments={"i": i}, result="ok") for i in range(10000)]
            gaps, stop = [], asyncio.Event()

            async def ticker():
                last = time.perf_counter()
                while not stop.is_set():
                    await asyncio.sleep(0.005)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            ticking = asyncio.create_task(ticker())
            await asyncio.sleep(0.02)
            started = time.perf_counter()
            await coordinator.record_tool_calls(made.rollout_id, made.token, calls)
            total = time.perf_counter() - started
            stop.set()
            await ticking
            assert store.count_tool_calls(made.rollout_id) == 10000
            return max(gaps), total

    gc.freeze()  # as the server's lifespan does: a full collection of the test process (torch loaded) is no batch's doing
    try:
        worst, total = asyncio.run(main())
    finally:
        gc.unfreeze()
    assert worst < max(0.25, total / 4), (worst, total)  # one piece took the whole batch (about 1.3 s) before


# ------------------------------------------------------------------ 7. strict types and OpenAI-style errors everywhere


def test_wrong_types_are_refused_not_coerced(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    made = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    base, auth = f"{handle.url}/rollouts/{made.rollout_id}", _bearer(made.token)
    cases = [
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {**CHAT, "logprobs": 1}, "logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "content"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, "max_tokens"),
        ("/reward", {"reward": True}, "reward"),
        ("/reward", {"reward": "0.5"}, "reward"),
        ("/reward", {"turn_rewards": [False]}, "turn_rewards"),
        ("/tool_calls", {"name": "x", "latency_s": "1"}, "latency_s"),
        ("/tool_calls", {"name": "x", "turn_index": 1.0}, "turn_index"),
    ]
    for path, body, field in cases:
        response = httpx.post(base + path, json=body, headers=auth)
        assert response.status_code == 400 and field in _error(response)["message"], (path, body, response.text)
    record = handle.store.get_rollout(made.rollout_id)
    assert (record.reward, len(record.turns), len(record.tool_calls)) == (None, 0, 0)
    assert httpx.post(base + "/reward", json={"reward": 1}, headers=auth).status_code == 200  # an int is a number


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/no/such/route", 404), ("POST", "/v1/nothing", 404), ("DELETE", "/v1/models", 405),
    ("PUT", "/rollouts/r-x/reward", 405), ("GET", "/v1/chat/completions", 405), ("GET", "/v1/rollouts", 405),
])
def test_unknown_paths_and_methods_answer_in_openai_shape(served, tiny_tok, method, path, status):
    handle = served(ScriptedEngine(tiny_tok, ["ok"]))
    response = httpx.request(method, handle.url + path)
    error = _error(response)
    assert response.status_code == status and error["code"] == status and path in error["message"]
