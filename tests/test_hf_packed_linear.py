"""Prepacked oneDNN linears in the hf engine (issue 21, decode): the same outputs as ``F.linear``, a weight
changed in place is packed again before its next use, training forwards never see a packed copy, and a plan
packs only the weight shapes it names, from the rows it names."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from mtrl_runtime.engines import HFEngine
from mtrl_runtime.engines.hf._packed_linear import (CROSSOVER_ROWS, MIN_GAIN, PackedLinears, cache_size_bytes,
                                                    choose, last_level_cache_bytes, packable_dtypes,
                                                    packing_plan)
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.torch_support import cpu_has_native_bf16
from mtrl_runtime.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
NATIVE_BF16 = pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 packs only on native-bf16 CPUs")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_packed_forwards_equal_plain_ones_and_pack_each_weight_once(tok):
    plain = tiny_model(tok)
    model = copy.deepcopy(plain)
    packed = PackedLinears(model)
    assert packed.layers == sum(type(m) is torch.nn.Linear for m in model.modules()) > 0
    ids = torch.tensor([tok.encode("a packed weight gives the same logits")] * 3)
    with torch.no_grad():
        expected = plain(ids).logits
        for _ in range(2):
            got = model(ids).logits
            assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    assert packed.packs == packed.layers, "the second forward reuses every packed copy"


def test_a_weight_changed_in_place_is_packed_again_before_its_next_use(tok):
    plain = tiny_model(tok)
    model = copy.deepcopy(plain)
    packed = PackedLinears(model)
    ids = torch.tensor([tok.encode("weights change when an adapter is folded in")])
    with torch.no_grad():
        model(ids)
        before = packed.packs
        for m in (plain, model):  # what folding LoRA or an optimizer step does: an in-place write
            m.model.layers[0].mlp.down_proj.weight.add_(0.05)
        expected, got = plain(ids).logits, model(ids).logits
    assert packed.packs == before + 1, "only the changed weight is packed again"
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()


def test_a_forward_that_records_gradients_goes_through_f_linear(tok):
    plain = tiny_model(tok)
    model = copy.deepcopy(plain)
    packed = PackedLinears(model)
    ids = torch.tensor([tok.encode("training forwards are not packed")])
    model(ids).logits.sum().backward()
    plain(ids).logits.sum().backward()
    assert packed.packs == 0
    w, v = model.model.layers[1].self_attn.q_proj.weight, plain.model.layers[1].self_attn.q_proj.weight
    assert w.grad is not None and torch.allclose(w.grad, v.grad, atol=1e-6)


@pytest.mark.skipif(cpu_has_native_bf16(), reason="this CPU computes bf16 natively: bf16 is packed here")
def test_bf16_is_left_to_f_linear_where_the_cpu_emulates_it(tok):
    model = tiny_model(tok).to(torch.bfloat16)
    packed = PackedLinears(model)
    with torch.no_grad():
        model(torch.tensor([tok.encode("bf16 is not packed")]))
    assert packed.packs == 0 and torch.bfloat16 not in packable_dtypes()
    assert packing_plan(model) == {}, "the probe packs bf16 only where the CPU computes it natively"


@NATIVE_BF16
def test_bf16_is_packed_where_the_cpu_computes_it_natively(tok):
    plain = tiny_model(tok).to(torch.bfloat16)
    model = copy.deepcopy(plain)
    packed = PackedLinears(model)
    ids = torch.tensor([tok.encode("a packed bf16 weight gives the same logits")] * 3)
    with torch.no_grad():
        expected, got = plain(ids).logits.float(), model(ids).logits.float()
    assert packed.packs == packed.layers > 0
    assert torch.allclose(got, expected, atol=2e-2, rtol=2e-2), (got - expected).abs().max()  # bf16 rounding
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.95


async def greedy(engine: HFEngine, prompts: list[tuple[int, ...]]) -> list:
    try:
        return await asyncio.gather(*(engine.generate(GenerationRequest(p, SamplingParams(
            temperature=0.0, max_tokens=12 + 3 * i, seed=i))) for i, p in enumerate(prompts)))
    finally:
        await engine.close()


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=NATIVE_BF16)])
def test_the_engine_decodes_the_same_tokens_with_packed_linears(tok, dtype):
    prompts = [tuple(tok.encode(f"row {i} of a batch" + " more" * i)) for i in range(4)]
    aten = HFEngine.from_objects(tiny_model(tok).to(dtype), tok, eos_token_ids=(), cpu_linear="aten")
    packed = HFEngine.from_objects(tiny_model(tok).to(dtype), tok, eos_token_ids=(), cpu_linear="packed")
    assert (aten.cpu_linear, aten.packed_linears) == ("aten", None)
    assert packed.cpu_linear == "packed" and packed.packed_linears is not None
    plain_out, packed_out = asyncio.run(greedy(aten, prompts)), asyncio.run(greedy(packed, prompts))
    for a, b in zip(plain_out, packed_out):
        assert a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
    assert packed.packed_linears.packs > 0


def test_an_unknown_cpu_linear_is_named_in_the_error(tok):
    with pytest.raises(ValueError, match="cpu_linear: expected one of auto, packed, aten, got 'fast'"):
        HFEngine.from_objects(tiny_model(tok), tok, cpu_linear="fast")


def test_switched_off_every_forward_goes_through_f_linear(tok):
    model = tiny_model(tok)
    packed = PackedLinears(model)
    packed.enabled = False
    with torch.no_grad():
        model(torch.tensor([tok.encode("switched off")]))
    assert packed.packs == 0



def test_a_plan_packs_only_the_shapes_it_names_and_only_from_its_rows(tok):
    plain = tiny_model(tok)
    model = copy.deepcopy(plain)
    mlp = model.model.layers[0].mlp
    gate_shape, down_shape = tuple(mlp.gate_proj.weight.shape), tuple(mlp.down_proj.weight.shape)
    assert gate_shape != down_shape
    packed = PackedLinears(model, plan={gate_shape: CROSSOVER_ROWS, down_shape: 1})
    served = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" in m.__dict__]
    assert packed.layers == len(served) > 0
    assert {tuple(m.weight.shape) for m in served} == {gate_shape, down_shape}
    few = torch.tensor([tok.encode("one")[:1]])  # a forward's rows are its tokens: one here
    many = torch.tensor([tok.encode("enough rows for the crossover")[:CROSSOVER_ROWS]])
    assert many.numel() == CROSSOVER_ROWS
    with torch.no_grad():
        got_few = model(few).logits
        down_only = packed.packs  # one row: the gate and up projections stay with F.linear
        got_many = model(many).logits
        expected_few, expected_many = plain(few).logits, plain(many).logits
    layers = len(model.model.layers)
    assert down_only == layers, "only the shape planned from one row was packed for a single row"
    assert packed.packs == packed.layers == 3 * layers, "gate, up and down, once the rows reach the crossover"
    for got, expected in ((got_few, expected_few), (got_many, expected_many)):
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    packed.release()
    assert packed.layers == 0 and not any("forward" in m.__dict__ or "_mtrl_packed" in m.__dict__
                                          for m in served), "released: the class's forward, no copies"
    with torch.no_grad():
        assert torch.equal(model(many).logits, expected_many)
    assert packed.packs == 3 * layers


@pytest.mark.parametrize(("times", "expected"), [
    ((1.0, 1.0, 2.0, 1.0), 1),  # as fast at one row, twice as fast at the decode batch: packed from one row
    ((1.0, 1.5, 2.0, 1.0), CROSSOVER_ROWS),  # slower at one row: packed only from the crossover
    ((1.0, 0.5, MIN_GAIN * 0.99, 1.0), None),  # under the gain at the decode batch: never, whatever one row says
])
def test_the_plan_packs_a_shape_only_where_the_decode_batch_gains(times, expected):
    assert choose(*times) == expected


def test_cache_sizes_are_read_as_sysfs_writes_them():
    assert cache_size_bytes("48K\n") == 48 << 10
    assert cache_size_bytes("266240K") == 266240 << 10
    assert cache_size_bytes("32M") == 32 << 20
    assert cache_size_bytes("1024") == 1024
    assert cache_size_bytes("") is None and cache_size_bytes("big") is None
    assert last_level_cache_bytes() > 0


def test_the_probe_plans_only_shapes_the_model_has_and_starts_cold_when_it_outgrows_the_cache(tok, monkeypatch):
    import mtrl_runtime.engines.hf._packed_linear as packed_linear

    model = tiny_model(tok)
    evictions = []
    real = packed_linear._Eviction

    class Counted(real):
        def __call__(self) -> None:
            evictions.append(self.buffer.numel() * 4)
            super().__call__()

    monkeypatch.setattr(packed_linear, "_Eviction", Counted)
    shapes = {tuple(m.weight.shape) for m in model.modules() if type(m) is torch.nn.Linear}
    plan = packing_plan(model, repeats=1)
    assert set(plan) <= shapes and set(plan.values()) <= {1, CROSSOVER_ROWS}
    assert evictions == [], "a model that fits in the cache is timed warm, as its decode steps run"
    monkeypatch.setattr(packed_linear, "last_level_cache_bytes", lambda: 4096)  # the tiny model outgrows it
    plan = packing_plan(model, repeats=1)
    assert set(plan) <= shapes
    assert evictions == [2 * 4096] * 4, "each round (a warm-up and one timed, at two row counts) starts cold"
