"""Prepacked oneDNN linears in the hf engine (issue 21, decode): the same outputs as ``F.linear``, a weight
changed in place is packed again before its next use, and training forwards never see a packed copy."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from mtrl_runtime.engines import HFEngine
from mtrl_runtime.engines.hf._packed_linear import PackedLinears, packable_dtypes, packing_pays
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
    assert packing_pays(model) is False, "the probe packs bf16 only where the CPU computes it natively"


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

