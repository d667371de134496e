"""The rollout decorator, update_reward and the openai redirect, against a served coordinator.

Plain OpenAI-client agents (sync and async, one client shared by every
rollout) run 16 concurrent rollouts on the scripted engine on 127.0.0.1;
bad reward reports are refused with clear errors and change nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import math
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from _adapter_support import (
    CRASH_KEY,
    aopenai_tool_loop,
    afinish_episode,
    check_attribution,
    finish_episode,
    openai_tool_loop,
    policy,
    specs,
    tasks,
)
from mtrl_adapters import (
    RolloutError,
    RolloutTimeout,
    current_rollout,
    instrument_openai,
    record_tool_call,
    rollout,
    rollout_scope,
    update_reward,
)
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import RolloutStatus, SamplingParams, Task


@pytest.fixture
def server(served, tiny_tok):
    return served(ScriptedEngine(tiny_tok, policy))


def _run_in_scope(fn, spec):
    with rollout_scope(spec):
        try:
            fn(spec.task)
        except RuntimeError:
            pass


def test_adapters_import_without_torch_or_frameworks():
    code = (
        "import sys, mtrl_adapters, mtrl_adapters.wire\n"
        "heavy = [m for m in ('torch', 'transformers', 'mtrl_runtime', 'openai', 'strands', 'langchain_core') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import mtrl_adapters.strands, mtrl_adapters.langgraph\n"
        "assert 'torch' not in sys.modules and 'mtrl_runtime' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_sync_openai_agent_16_threads_share_one_client(server):
    client = openai.OpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0)

    @rollout
    def agent(task):
        finish_episode(task, openai_tool_loop(client, task))

    runs = specs(server, tasks(16))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda s: contextvars.copy_context().run(_run_in_scope, agent, s), runs))
    for spec in runs:
        check_attribution(server.store, spec)
    assert server.coordinator.counters["auth_rejected"] == 0


async def test_async_openai_agent_16_tasks_share_one_client(server):
    client = openai.AsyncOpenAI(api_key="sk-user-real-key", max_retries=0)

    @rollout
    async def agent(task):
        await afinish_episode(task, await aopenai_tool_loop(client, task))
        return "done"

    async def one(spec):
        with rollout_scope(spec) as ctx:
            try:
                assert await agent(spec.task) == "done"
            except RuntimeError as exc:
                assert "crashed on purpose" in str(exc)
        return ctx

    runs = specs(server, tasks(16))
    contexts = await asyncio.gather(*(one(s) for s in runs))
    for spec, ctx in zip(runs, contexts):
        rollout_ = check_attribution(server.store, spec)
        assert ctx.outcome.status == rollout_.status.value
    crashed = [c for c in contexts if c.outcome.status == "failed"]
    assert len(crashed) == 1 and CRASH_KEY in crashed[0].task.prompt


class _Capture(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_POST(self):
        type(self).seen.append(dict(self.headers))
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"error": {"message": "capture server"}}'
        self.send_response(418)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_real_api_key_never_leaves_inside_a_rollout(server):
    capture = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=capture.serve_forever, daemon=True).start()
    _Capture.seen = []
    try:
        client = openai.OpenAI(api_key="sk-user-real-key", base_url=f"http://127.0.0.1:{capture.server_port}/v1",
                               max_retries=0)
        [spec] = specs(server, tasks(1))

        @rollout
        def agent(task):
            return client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])

        with rollout_scope(spec):
            reply = agent(spec.task)
        assert reply.choices[0].message.content  # answered by the server
        assert _Capture.seen == []  # nothing went to the client's own base_url
        assert instrument_openai() is False  # installed once, by the decorator
        assert server.store.count_turns(spec.rollout_id) == 1

        with pytest.raises(openai.APIStatusError):  # outside a rollout: the client is untouched
            agent(spec.task)
        assert len(_Capture.seen) == 1 and _Capture.seen[0]["Authorization"] == "Bearer sk-user-real-key"
    finally:
        capture.shutdown()
        capture.server_close()


def test_decorator_forms_nesting_and_context_manager(server):
    client = openai.OpenAI(api_key="unused", max_retries=0)
    a, b, c, d = specs(server, tasks(4))

    @rollout()
    def inner(task):
        assert current_rollout().rollout_id == a.rollout_id
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])

    @rollout
    def outer(task):
        inner(task)  # nested: part of the same rollout, closes nothing
        assert not current_rollout().closed
        update_reward(1.0)
        return "outer"

    with rollout_scope(a) as ctx:
        assert outer(a.task) == "outer"
    assert ctx.closed and ctx.outcome.status == "completed" and ctx.outcome.reward == 1.0
    assert outer.__wrapped__ is not None and current_rollout() is None

    with rollout(context=b) as ctx_b:  # code that is not a function
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": b.task.prompt}])
        update_reward(0.25)
    assert ctx_b.outcome.status == "completed" and ctx_b.outcome.turns == 1

    with pytest.raises(ValueError, match="boom"):
        with rollout_scope(c), rollout():
            raise ValueError("boom")
    failed = server.store.get_rollout(c.rollout_id)
    assert failed.status is RolloutStatus.FAILED and failed.error.startswith("ValueError: boom")

    async def async_block():
        async with rollout(context=d) as ctx_d:
            await openai.AsyncOpenAI(api_key="unused", max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": d.task.prompt}])
        return ctx_d

    assert asyncio.run(async_block()).outcome.status == "completed"


class _FirstRewardLate(httpx.AsyncBaseTransport):
    """Real HTTP to the coordinator, the rollout's first reward report held back 0.3 s (a slow connection)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.held = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/reward") and self.held == 0:
            self.held += 1
            await asyncio.sleep(0.3)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_rewards_reported_in_the_background_are_recorded_in_the_order_the_agent_made_them(server):
    """From async code update_reward sends in the background; the report made last is the one kept."""
    client = openai.AsyncOpenAI(api_key="unused", max_retries=0)

    @rollout
    async def agent(task):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        update_reward(0.25, {"report": 1.0})
        update_reward(1.0, {"report": 2.0})  # replaces the first while it is still on its way
        return "done"

    [spec] = specs(server, tasks(1))
    transport = _FirstRewardLate()
    async with httpx.AsyncClient(transport=transport) as http:
        with rollout_scope(spec, http=http):
            assert await agent(spec.task) == "done"
    assert transport.held == 1
    stored = server.store.get_rollout(spec.rollout_id)
    assert (stored.reward, stored.metrics.get("report")) == (1.0, 2.0), (stored.reward, stored.metrics)


def test_outside_a_rollout_the_decorated_function_runs_plain():
    @rollout
    def agent(task):
        assert current_rollout() is None
        return task.upper()

    with pytest.warns(RuntimeWarning, match="outside a rollout"):
        assert update_reward(1.0) is False
    assert agent("x") == "X"
    assert record_tool_call("lookup", {"key": "K1"}) is False


def test_rollout_sampling_overrides_the_agents(server):
    [spec] = specs(server, tasks(1), max_tokens=3)
    client = openai.OpenAI(api_key="unused", max_retries=0)

    @rollout
    def agent(task):
        return client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.prompt}], max_tokens=200, temperature=0.0
        )

    with rollout_scope(spec):
        reply = agent(spec.task)
    assert reply.choices[0].finish_reason == "length"
    [turn] = server.store.get_rollout(spec.rollout_id).turns
    assert len(turn.completion_ids) == 3


def test_async_agent_past_its_timeout_is_timed_out(server):
    slow, late = specs(server, tasks(2), timeout_s=0.3)

    @rollout
    async def sleepy(task):
        await asyncio.sleep(5)

    async def go():
        with rollout_scope(slow):
            await sleepy(slow.task)

    started = time.monotonic()
    with pytest.raises(RolloutTimeout):
        asyncio.run(go())
    assert time.monotonic() - started < 3
    record = server.store.get_rollout(slow.rollout_id)
    assert record.status is RolloutStatus.TIMED_OUT and "timeout_s=0.3" in record.error
    assert record.reward_defaulted and record.metrics["reward_defaulted"] == 1.0

    @rollout
    def overran(task):
        time.sleep(0.4)
        return "late"

    with rollout_scope(late):
        assert overran(late.task) == "late"  # a sync agent cannot be interrupted: it is marked late
    assert server.store.get_rollout(late.rollout_id).status is RolloutStatus.TIMED_OUT


def test_never_reported_reward_gets_the_default_and_a_flag(server):
    [spec] = specs(server, tasks(1))

    @rollout
    def silent(task):
        return None

    with rollout_scope(spec) as ctx:
        silent(spec.task)
    assert ctx.outcome.reward == server.coordinator.config.advanced.default_reward
    record = server.store.get_rollout(spec.rollout_id)
    assert record.reward_defaulted and record.metrics == {"reward_defaulted": 1.0}


def _stored(store, rollout_id):
    r = store.get_rollout(rollout_id, with_turns=False)
    return r.reward, r.turn_rewards, dict(r.metrics), r.status


def test_bad_rewards_are_clear_errors_and_change_nothing(server):
    [spec, other] = specs(server, tasks(2))
    client = openai.OpenAI(api_key="unused", max_retries=0)
    store = server.store
    with rollout_scope(spec) as ctx:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": spec.task.prompt}])
        update_reward(0.5, {"acc": 1.0})
        before = _stored(store, spec.rollout_id)
        for bad, match in ((math.nan, "reward must be a finite number"), (math.inf, "finite"),
                           ([0.1, math.inf], r"turn_rewards\[1\]")):
            with pytest.raises(ValueError, match=match):
                update_reward(bad)
        with pytest.raises(ValueError, match=r"metrics\['acc'\].*finite"):
            update_reward(1.0, {"acc": math.nan})
        with pytest.raises(TypeError, match="reward must be a float, got '1.0'"):
            update_reward("1.0")
        with pytest.raises(RolloutError, match="turn_rewards has 2 values but rollout .* has 1 turns") as err:
            update_reward([0.0, 1.0])
        assert err.value.status == 400 and err.value.param == "turn_rewards"
        assert _stored(store, spec.rollout_id) == before

    from mtrl_adapters import RolloutContext

    unknown = RolloutContext(rollout_id="r-unknown", token="t", endpoint=server.url)
    with pytest.raises(RolloutError, match="unknown rollout id 'r-unknown'") as err:
        unknown.update_reward(1.0)
    assert err.value.status == 404
    wrong = RolloutContext(rollout_id=spec.rollout_id, token=other.token, endpoint=server.url)
    with pytest.raises(RolloutError, match="the token does not belong to this rollout") as err:
        wrong.update_reward(0.9)
    assert err.value.status == 403
    with pytest.raises(RolloutError) as err:
        wrong.complete("failed", "forged")
    assert err.value.status == 403
    with pytest.raises(RolloutError) as err:
        wrong.client().report_tool_calls([_report()])
    assert err.value.status == 403
    assert _stored(store, spec.rollout_id) == before and store.get_rollout(spec.rollout_id).tool_calls == ()

    ctx.complete()
    ctx.update_reward(0.5, {"acc": 1.0})  # the same report again: fine
    with pytest.raises(RolloutError, match=r"has ended with reward 0.5; a different reward \(0.75\) is refused") as err:
        ctx.update_reward(0.75)
    assert err.value.status == 409
    assert _stored(store, spec.rollout_id) == (0.5, None, {"acc": 1.0}, RolloutStatus.COMPLETED)


def _report():
    from mtrl_adapters.wire import ToolCallReport

    return ToolCallReport(name="lookup", arguments={"key": "K00"}, result="0")


def test_absolute_urls_outside_base_url_are_refused(server):
    [spec] = specs(server, tasks(1))
    client = openai.OpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0)

    @rollout
    def agent(task):
        return client.get("https://elsewhere.example/v1/models", cast_to=object)

    with rollout_scope(spec), pytest.raises(RuntimeError, match="absolute URL 'https://elsewhere.example"):
        agent(spec.task)
    assert server.store.get_rollout(spec.rollout_id).status is RolloutStatus.FAILED


def test_tool_calls_land_on_the_turn_that_asked_for_them(server):
    [spec] = specs(server, tasks(1))
    client = openai.OpenAI(api_key="unused", max_retries=0)

    @rollout
    def agent(task):
        return openai_tool_loop(client, task)

    with rollout_scope(spec):
        assert agent(spec.task) == 3
    record = server.store.get_rollout(spec.rollout_id)
    by_name = {c.name: c for c in record.tool_calls}
    assert [by_name["lookup"].turn_index, by_name["add"].turn_index] == [0, 1]
    assert by_name["add"].call_id == record.turns[1].tool_calls[0]["id"]
    assert json.loads(json.dumps(by_name["add"].arguments)) == {"a": 0, "b": 5}


def test_rollout_spec_sampling_fields_are_read_by_attribute():
    from mtrl_adapters import RolloutContext
    from mtrl_runtime.types import RolloutSpec

    spec = RolloutSpec(rollout_id="r-1", group_id="g", task=Task(id="t"), token="secret-xyz", endpoint="http://127.0.0.1:1",
                       model_name="m", sampling=SamplingParams(temperature=0.7, max_tokens=64), max_turns=3,
                       timeout_s=9.0)
    ctx = RolloutContext.from_spec(spec)
    assert ctx.sampling == {"temperature": 0.7, "top_p": 1.0, "max_tokens": 64}
    assert (ctx.max_turns, ctx.timeout_s, ctx.base_url) == (3, 9.0, "http://127.0.0.1:1/rollouts/r-1/v1")
    assert "secret-xyz" not in repr(ctx)
    with pytest.raises(ValueError, match="endpoint must be an http"):
        RolloutContext(rollout_id="r", token="t", endpoint="127.0.0.1:1")


def test_async_agent_on_the_coordinators_own_loop_never_blocks_it(server):
    """Sync update_reward inside an async agent that shares the server's loop: sent in the background."""
    [spec, bad] = specs(server, tasks(2))
    client = openai.AsyncOpenAI(api_key="unused", max_retries=0)

    @rollout
    async def agent(task):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        update_reward([1.0] if task is spec.task else [0.0, 1.0])  # bad: 2 values for 1 turn
        return "ok"

    async def one(s):
        with rollout_scope(s):
            return await agent(s.task)

    done = asyncio.run_coroutine_threadsafe(one(spec), server.loop).result(timeout=30)
    assert done == "ok"
    assert server.store.get_rollout(spec.rollout_id).turn_rewards == (1.0,)
    with pytest.raises(RolloutError, match="turn_rewards has 2 values"):  # refused: raised as the rollout closes
        asyncio.run_coroutine_threadsafe(one(bad), server.loop).result(timeout=30)
    record = server.store.get_rollout(bad.rollout_id)
    assert record.status is RolloutStatus.COMPLETED and record.reward_defaulted


async def test_one_rollout_object_serves_concurrent_with_blocks(server):
    shared = rollout()  # e.g. a module-level `trainable = rollout()`
    client = openai.AsyncOpenAI(api_key="unused", max_retries=0)

    async def one(spec, delay):
        with rollout_scope(spec):
            async with shared as ctx:
                await asyncio.sleep(delay)  # interleave the two blocks' enter and exit
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": spec.task.prompt}])
        return ctx

    runs = specs(server, tasks(2))
    contexts = await asyncio.gather(one(runs[0], 0.0), one(runs[1], 0.3))  # the first in leaves first
    for spec, ctx in zip(runs, contexts):
        assert ctx.rollout_id == spec.rollout_id and ctx.outcome.status == "completed" and ctx.outcome.turns == 1
