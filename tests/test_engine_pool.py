"""Several servers behind one engine (``engines/vllm/_pool.py``), without vLLM.

Each server is a scripted engine (the project's model double): the routing,
the adapter rollout, a server's death and the streaming pass-through are the
pool's and are tested through the ``PolicyEngine`` interface, one rollout
end to end through the coordinator's real HTTP endpoint. A "death" is a
server whose requests in flight fail at once and whose probe says it is gone,
as a killed vLLM process does (tests/test_vllm_pool.py kills real ones).
The option checks run through the config and the registry's factory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import pytest

from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.engines import EngineClosedError, ScriptedEngine, check_pool_options, create_engine
from mtrl_runtime.engines.vllm import (
    EnginePool, PoolMember, ServerDownError, StreamingEnginePool, assign_gpus, make_pool, visible_gpus,
)
from mtrl_runtime.types import Generation, GenerationRequest, SamplingParams, StreamingEngine, TokenDelta

pytestmark = pytest.mark.timeout(120)


class Server(ScriptedEngine):
    """A scripted server that can die: its requests in flight then fail, and its probe says it is gone."""

    def __init__(self, tokenizer: Any, name: str, log: list[tuple[str, str | None, int]], *,
                 load_delay_s: float = 0.0, load_error: str | None = None, **options: Any) -> None:
        super().__init__(tokenizer, self._answer, **options)
        self.server_name = name
        self.log = log  # (server, rollout id, turn) of every request answered
        self.load_delay_s = load_delay_s
        self.load_error = load_error
        self.dead = asyncio.Event()
        self.peers: list["Server"] = []
        self.versions_seen: list[tuple[int | None, list[list[int]]]] = []  # per request: (adapter, peers' versions)

    def _answer(self, request: GenerationRequest, prompt: str) -> str:
        self.log.append((self.server_name, request.rollout_id, request.turn_index))
        self.versions_seen.append((request.adapter, [[v for _, v in p.adapters] for p in self.peers]))
        return f"{self.server_name} answers turn {request.turn_index}"

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.dead.is_set():
            raise ConnectionRefusedError(f"{self.server_name}: connection refused")
        answer = asyncio.ensure_future(super().generate(request))
        death = asyncio.ensure_future(self.dead.wait())
        await asyncio.wait([answer, death], return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            death.cancel()
            return answer.result()
        answer.cancel()
        raise ConnectionResetError(f"{self.server_name}: connection reset by peer")

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]:
        async for item in super().generate_stream(request):
            if self.dead.is_set():
                raise ConnectionResetError(f"{self.server_name}: connection reset by peer")
            yield item

    async def load_adapter(self, path: str, version: int) -> None:
        await asyncio.sleep(self.load_delay_s)
        if self.load_error is not None:
            raise RuntimeError(self.load_error)
        await super().load_adapter(path, version)

    async def probe(self) -> bool:
        return not self.dead.is_set()


def pool_of(tok: Any, names: str, **options: Any) -> tuple[EnginePool, dict[str, Server], list]:
    log: list[tuple[str, str | None, int]] = []
    servers = {name: Server(tok, name, log, **options.get(name, options.get("all", {}))) for name in names}
    for server in servers.values():
        server.peers = list(servers.values())
    members = [PoolMember(name, s, s.probe, f"http://127.0.0.1:{8000 + i}")
               for i, (name, s) in enumerate(servers.items())]
    return make_pool(members), servers, log


def turn(tok: Any, rollout: str | None, index: int, adapter: int | None = None) -> GenerationRequest:
    return GenerationRequest(tuple(tok.encode("hello there")), SamplingParams(max_tokens=32), adapter=adapter,
                             rollout_id=rollout, turn_index=index)


def per_rollout(log: list[tuple[str, str | None, int]]) -> dict[str | None, set[str]]:
    servers: dict[str | None, set[str]] = {}
    for server, rollout, _ in log:
        servers.setdefault(rollout, set()).add(server)
    return servers


async def test_a_rollout_stays_on_its_server_and_new_rollouts_go_to_the_least_loaded(tiny_tok: Any) -> None:
    pool, servers, log = pool_of(tiny_tok, "abc", all={"delay_s": 0.05})
    rollouts = [f"r{i}" for i in range(6)]
    for index in range(3):  # three turns of six concurrent rollouts
        await asyncio.gather(*(pool.generate(turn(tiny_tok, r, index)) for r in rollouts))
    placed = per_rollout(log)
    assert all(len(placed[r]) == 1 for r in rollouts), placed  # every turn of a rollout on one server
    assert sorted(sum(1 for r in rollouts if placed[r] == {n}) for n in "abc") == [2, 2, 2]
    assert all(pool.pinned_server(r) == next(iter(placed[r])) for r in rollouts)
    stats = pool.stats
    assert [(s.name, s.requests, s.in_flight, s.pinned, s.repins) for s in stats.servers] == [
        (n, 6, 0, 2, 0) for n in "abc"]
    assert stats.generations == 0 and stats.repins == 0  # scripted servers keep no EngineStats
    # a busy server gets no new rollout: the least loaded does
    slow = asyncio.ensure_future(asyncio.gather(*(pool.generate(turn(tiny_tok, r, 3)) for r in ("r0", "r1"))))
    await asyncio.sleep(0.01)
    busy = {pool.pinned_server("r0"), pool.pinned_server("r1")}
    await pool.generate(turn(tiny_tok, "new", 0))
    assert pool.pinned_server("new") not in busy
    await slow
    # calls of no rollout are spread, never pinned
    await asyncio.gather(*(pool.generate(turn(tiny_tok, None, 0)) for _ in range(3)))
    assert sorted(server for server, rollout, _ in log if rollout is None) == ["a", "b", "c"]
    await pool.close()
    with pytest.raises(EngineClosedError, match="pool is closed"):
        await pool.generate(turn(tiny_tok, "r0", 9))


async def test_an_adapter_is_on_every_server_before_a_request_names_its_version(tiny_tok: Any) -> None:
    pool, servers, log = pool_of(tiny_tok, "ab", a={"load_delay_s": 0.0}, b={"load_delay_s": 0.3})
    await pool.generate(turn(tiny_tok, "r0", 0, adapter=0))
    loading = asyncio.ensure_future(pool.load_adapter("/adapters/v1", 1))
    await asyncio.sleep(0.05)
    assert servers["a"].adapters == [("/adapters/v1", 1)] and servers["b"].adapters == []  # b still loading
    assert pool.policy_version == 0  # not yet: a rollout created now starts on version 0
    named = [asyncio.ensure_future(pool.generate(turn(tiny_tok, f"r{i}", 0, adapter=1))) for i in range(4)]
    old = await pool.generate(turn(tiny_tok, "old", 0, adapter=0))  # an older version is not held up
    assert old.policy_version in (0, 1) and not loading.done()
    generations = await asyncio.gather(*named)
    await loading
    assert pool.policy_version == 1 and all(g.policy_version == 1 for g in generations)
    for server in servers.values():
        for adapter, peers in server.versions_seen:
            if adapter == 1:
                assert peers == [[1], [1]], "a request for version 1 went out before every server had it"
    with pytest.raises(ValueError, match="version: 1 is already loaded"):
        await pool.load_adapter("/adapters/v1", 1)
    with pytest.raises(ValueError, match="version: expected an int >= 0, got -1"):
        await pool.load_adapter("/adapters/v1", -1)
    await pool.close()


async def test_a_server_that_fails_the_load_leaves_rotation_loudly(
    tiny_tok: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pool, servers, log = pool_of(tiny_tok, "ab", b={"load_error": "adapter rank 64 exceeds --max-lora-rank 8"})
    await asyncio.gather(*(pool.generate(turn(tiny_tok, f"r{i}", 0)) for i in range(4)))
    on_b = [r for r in ("r0", "r1", "r2", "r3") if pool.pinned_server(r) == "b"]
    assert on_b
    with caplog.at_level(logging.WARNING):
        await pool.load_adapter("/adapters/v1", 1)
    assert "server b (http://127.0.0.1:8001) left rotation: loading adapter '/adapters/v1' as version 1 failed: " \
           "RuntimeError: adapter rank 64 exceeds --max-lora-rank 8; 1 server(s) left: a" in caplog.text
    b = pool.stats.servers[1]
    assert not b.live and "max-lora-rank" in (b.down_reason or "") and pool.policy_version == 1
    answers = await asyncio.gather(*(pool.generate(turn(tiny_tok, r, 1, adapter=1)) for r in on_b))
    assert all(a.policy_version == 1 for a in answers)
    assert all(pool.pinned_server(r) == "a" for r in on_b)
    assert pool.stats.repins == len(on_b) and pool.stats.servers[0].repins == len(on_b)
    servers["a"].load_error = "disk full"
    with pytest.raises(ServerDownError, match=r"version 2 failed on every server: a \(http://127.0.0.1:8000\): "
                                              r"RuntimeError: disk full"):
        await pool.load_adapter("/adapters/v2", 2)
    assert pool.policy_version == 1
    await pool.close()


async def test_a_dead_server_fails_only_its_turns_in_flight_and_its_rollouts_move(tiny_tok: Any) -> None:
    pool, servers, log = pool_of(tiny_tok, "ab", all={"delay_s": 0.3})
    rollouts = [f"r{i}" for i in range(4)]
    in_flight = [asyncio.ensure_future(pool.generate(turn(tiny_tok, r, 0))) for r in rollouts]
    await asyncio.sleep(0.05)
    assert [s.in_flight for s in pool.stats.servers] == [2, 2]
    on_a = {r for r in rollouts if pool.pinned_server(r) == "a"}
    servers["a"].dead.set()  # server a is killed with two turns in flight
    results = dict(zip(rollouts, await asyncio.gather(*in_flight, return_exceptions=True)))
    for rollout, result in results.items():
        if rollout in on_a:
            assert isinstance(result, ServerDownError)
            assert str(result).startswith("server a (http://127.0.0.1:8000) stopped serving while this turn was "
                                          "in flight (ConnectionResetError: a: connection reset by peer)")
        else:
            assert isinstance(result, Generation) and result.finish_reason == "stop"  # b's turns untouched
    a, b = pool.stats.servers
    assert (a.live, a.failures, a.in_flight, b.live, b.failures, b.in_flight) == (False, 2, 0, True, 0, 0)
    # the rollouts pinned to a move to b on their next call, counted: their prefix cache is lost
    await asyncio.gather(*(pool.generate(turn(tiny_tok, r, 1)) for r in rollouts))
    assert all(pool.pinned_server(r) == "b" for r in rollouts)
    assert pool.stats.repins == 2 and pool.stats.servers[1].repins == 2
    # a failure that is not the server's (bad input) does not take it out
    with pytest.raises(ValueError, match="sampling.max_tokens"):
        await pool.generate(GenerationRequest((1, 2), SamplingParams(max_tokens=0), rollout_id="r0"))
    assert pool.stats.servers[1].live
    servers["b"].dead.set()
    with pytest.raises(ServerDownError, match="stopped serving"):
        await pool.generate(turn(tiny_tok, "r0", 2))
    with pytest.raises(ServerDownError, match=r"no server is left in rotation: a \(http://127.0.0.1:8000\): it "
                                              r"stopped serving: .*; b \(http://127.0.0.1:8001\): it stopped serving"):
        await pool.generate(turn(tiny_tok, "r0", 3))
    await pool.close()


async def test_streaming_passes_through_when_the_servers_stream(tiny_tok: Any) -> None:
    pool, servers, log = pool_of(tiny_tok, "ab", all={"token_delay_s": 0.001})
    assert isinstance(pool, StreamingEnginePool) and isinstance(pool, StreamingEngine)
    items = [item async for item in pool.generate_stream(turn(tiny_tok, "r0", 0))]
    whole = await pool.generate(turn(tiny_tok, "r0", 1))
    deltas, final = items[:-1], items[-1]
    assert all(isinstance(d, TokenDelta) for d in deltas) and isinstance(final, Generation)
    assert sum((d.token_ids for d in deltas), ()) == final.completion_ids and len(deltas) > 3
    assert tiny_tok.decode(final.completion_ids[:-1]).endswith("answers turn 0")
    assert tiny_tok.decode(whole.completion_ids[:-1]).endswith("answers turn 1")
    assert per_rollout(log)["r0"] == {pool.pinned_server("r0")}
    stream = pool.generate_stream(turn(tiny_tok, "r0", 2))
    assert isinstance(await stream.__anext__(), TokenDelta)
    await stream.aclose()  # a client that hangs up: the stream ends, nothing stays counted in flight
    assert [s.in_flight for s in pool.stats.servers] == [0, 0]
    servers["a"].dead.set()
    servers["b"].dead.set()
    with pytest.raises(ServerDownError, match="stopped serving while this turn was in flight"):
        async for _ in pool.generate_stream(turn(tiny_tok, "r0", 3)):
            pass
    await pool.close()

    class Whole:  # an engine that answers whole: its pool does not claim to stream
        name, tokenizer, policy_version, context_length = "whole", tiny_tok, 0, 128

        async def generate(self, request: GenerationRequest) -> Generation:
            raise NotImplementedError

        async def load_adapter(self, path: str, version: int) -> None: ...

        async def close(self) -> None: ...

    async def alive() -> bool:
        return True

    plain = make_pool([PoolMember("x", Whole(), alive), PoolMember("y", Whole(), alive)])
    assert type(plain) is EnginePool and not isinstance(plain, StreamingEngine) and plain.context_length == 128


async def test_rollouts_through_the_coordinator_keep_their_server(tiny_tok: Any, served: Any) -> None:
    """Real HTTP: each rollout's three calls reach one server, and its turns extend one another there."""
    import openai

    from mtrl_adapters import aupdate_reward
    from mtrl_runtime.executors import InProcessExecutor
    from mtrl_runtime.types import RolloutSpec, RolloutStatus, Task

    pool, servers, log = pool_of(tiny_tok, "ab", all={"delay_s": 0.02})

    async def agent(task: Any) -> None:
        client = openai.AsyncOpenAI(api_key="sk-unused", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        for _ in range(3):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
        await aupdate_reward(1.0)

    handle = served(pool)

    async def one(i: int) -> str:
        task = Task(id=f"t{i}", prompt=f"question {i}")
        created = handle.coordinator.create_rollout(task)
        spec = RolloutSpec(created.rollout_id, created.group_id, task, created.token, handle.url, "policy",
                           SamplingParams(max_tokens=16), max_turns=3, timeout_s=60)
        outcome = await InProcessExecutor(agent).run(spec)
        assert outcome.status is RolloutStatus.COMPLETED, outcome.error
        return created.rollout_id

    ids = await asyncio.gather(*(one(i) for i in range(4)))
    placed = per_rollout(log)
    assert all(len(placed[r]) == 1 for r in ids) and {next(iter(placed[r])) for r in ids} == {"a", "b"}
    for rollout_id in ids:
        rollout = handle.store.get_rollout(rollout_id)
        server = next(iter(placed[rollout_id]))
        assert [t.completion_text for t in rollout.turns] == [f"{server} answers turn {i}" for i in range(3)]
    await pool.close()


# ---------------------------------------------------------------------- options
def test_pool_options_are_checked_at_config_load_naming_the_field_and_value() -> None:
    def load(engine: str, **options: Any) -> MtrlConfig:
        return MtrlConfig.from_dict({"core": {"engine": engine}, "advanced": {"engine_options": options}})

    cases = {
        "advanced.engine_options.servers: expected how many vLLM servers mtrl starts, an int >= 1, got 0":
            {"servers": 0},
        "advanced.engine_options.servers: expected how many vLLM servers mtrl starts, an int >= 1, got True":
            {"servers": True},
        "advanced.engine_options.urls: expected http(s) URLs of running vLLM servers, got 'localhost:8000'":
            {"urls": ["localhost:8000"]},
        "advanced.engine_options.urls: expected a non-empty list": {"urls": "http://a:1"},
        "advanced.engine_options.urls: 'http://a:1' is listed twice": {"urls": ["http://a:1", "http://a:1/"]},
        "advanced.engine_options.gpus_per_server: 2 needs advanced.engine_options.servers": {"gpus_per_server": 2},
        "advanced.engine_options.url: 'http://a:1' names one running server": {"url": "http://a:1", "servers": 2},
        "advanced.engine_options.max_restarts: 3 applies to one server": {"servers": 2, "max_restarts": 3},
    }
    for message, options in cases.items():
        with pytest.raises(ConfigError) as caught:
            load("vllm", **options)
        assert message in str(caught.value), (message, str(caught.value))
    with pytest.raises(ConfigError, match="advanced.engine_options.servers: 2 asks for several vLLM servers, but "
                                          "core.engine is 'hf'"):
        load("hf", servers=2)
    ok = load("vllm", servers=2, urls=["http://10.0.0.2:8000"], gpus_per_server=1)
    assert ok.advanced.engine_options["servers"] == 2 and check_pool_options(ok.advanced.engine_options) == 3


def test_gpus_are_split_evenly_between_the_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert assign_gpus(2, ["0", "1", "2", "3"], None) == [["0", "1"], ["2", "3"]]
    assert assign_gpus(3, ["4", "5", "6", "7"], 1) == [["4"], ["5"], ["6"]]
    assert assign_gpus(2, [], None) == [None, None]  # vLLM on CPU
    with pytest.raises(ValueError, match=r"servers: 3 servers x gpus_per_server 1 need more than the 2 visible GPU"):
        assign_gpus(3, ["0", "1"], None)
    with pytest.raises(ValueError, match="gpus_per_server: 1 but no GPU is visible"):
        assign_gpus(2, [], 1)
    assert visible_gpus("2, 3") == ["2", "3"] and visible_gpus("") == [] and visible_gpus("-1") == []
    monkeypatch.setenv("PATH", "/nonexistent")
    assert visible_gpus(None) == []  # no nvidia-smi: no GPU


async def test_servers_by_url_form_a_pool_that_names_each_unreachable_one(tiny_model_dir: Any) -> None:
    from mtrl_runtime.engines.vllm._ports import free_port

    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    pool = create_engine("vllm", str(tiny_model_dir), urls=urls, keep_versions=3)
    assert isinstance(pool, EnginePool) and [m.url for m in pool.members] == urls
    with pytest.raises(ServerDownError) as caught:
        await pool.generate(GenerationRequest((1, 2), SamplingParams(), rollout_id="r0"))
    for i, url in enumerate(urls):
        assert f"server url-{i} ({url}) did not start: VLLMServerError: could not reach the vLLM server at {url}" \
            in str(caught.value)
    await pool.close()
    with pytest.raises(ValueError, match=r"urls: the servers are already running; drop \['dtype'\]"):
        create_engine("vllm", str(tiny_model_dir), urls=urls, dtype="float32")
    with pytest.raises(ValueError, match="servers: expected how many vLLM servers"):
        create_engine("vllm", str(tiny_model_dir), servers=-1)
    one = create_engine("vllm", str(tiny_model_dir), urls=urls[:1])  # one server by URL: the plain engine
    assert type(one).__name__ == "VLLMEngine" and one.url == urls[0]
    await one.close()
