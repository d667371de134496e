"""LoRA folded into the base weights for serving: same outputs, base weights restored bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mtrl_runtime.engines.hf._lora_fold import LoraFold
from mtrl_runtime.testing import tiny_model


def _peft(tok: Any, dtype: torch.dtype = torch.float32, **lora: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                        init_lora_weights=False, **lora)
    return get_peft_model(tiny_model(tok).to(dtype), config).eval()


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _base_weights(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer" in n}


def test_folded_model_gives_the_unfolded_logits_and_unfold_restores_the_weights(tiny_tok):
    model = _peft(tiny_tok)
    ids = torch.tensor([tiny_tok.encode("fold the adapter into the weights")])
    want, weights = _logits(model, ids), _base_weights(model)
    fold = LoraFold(model)
    assert fold.fold() and fold.folded
    layers = [m for m in model.modules() if hasattr(m, "merged_adapters")]
    assert layers and all(layer.merged for layer in layers)
    assert any(not torch.equal(weights[n], p) for n, p in model.named_parameters() if n in weights)
    torch.testing.assert_close(_logits(model, ids), want, atol=1e-5, rtol=1e-5)
    fold.unfold()
    assert not fold.folded and not any(layer.merged for layer in layers)
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters() if n in weights)
    assert torch.equal(_logits(model, ids), want)


def test_bf16_fold_and_unfold_cycles_leave_no_rounding_in_the_base_weights(tiny_tok):
    model = _peft(tiny_tok, torch.bfloat16)
    weights = _base_weights(model)
    fold = LoraFold(model)
    for _ in range(3):
        assert fold.fold()
        fold.unfold()
        with torch.no_grad():  # a training step moves the adapter between folds
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.add_(1e-3)
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters() if n in weights)


@pytest.mark.parametrize("setup", ["dora", "disabled", "plain model"])
def test_models_that_cannot_fold_are_left_as_they_are(tiny_tok, setup):
    model = tiny_model(tiny_tok) if setup == "plain model" else _peft(tiny_tok, use_dora=setup == "dora")
    if setup == "disabled":
        from peft.tuners.lora import LoraLayer

        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.enable_adapters(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fold = LoraFold(model)
    assert fold.fold() is False and not fold.folded
    fold.unfold()
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
