"""Serve the base model on an engine that holds a fine-tuned adapter, for a side-by-side evaluation.

Inside ``base_policy(engine)`` every LoRA layer of the engine's model is
disabled (peft's ``enable_adapters(False)`` on each tuner layer: the same
switch ``PeftModel.disable_adapter()`` flips, and it also reaches adapters
injected in place by a trainer; adapters the engine folded into the base
weights are unfolded first) and the engine reports policy version 0, so
new rollouts are recorded as the base model's. On exit the layers and the
version are restored. The switch happens under the engine's
``weights_lock``, between forward passes; run no other rollouts meanwhile.
Assigning ``policy_version`` there also clears the ``hf`` engine's prefix
cache (see ``engines.hf``): KV computed with the adapter must not serve the
base model, nor the reverse.

An engine without a model object (the scripted double) only changes its
``policy_version``: its script can answer by ``request.adapter``.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, nullcontext
from typing import Any, AsyncIterator

from ..torch_support import on_own_thread
from ..types import PolicyEngine, SharedModelEngine


def adapter_layers(engine: PolicyEngine) -> list[Any]:
    """The peft tuner layers inside the engine's model (empty when it holds no adapter or no model)."""
    if not isinstance(engine, SharedModelEngine) or engine.model is None:
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer  # peft loads only for an engine that holds a model

    return [m for m in engine.model.modules() if isinstance(m, BaseTunerLayer)]


@asynccontextmanager
async def base_policy(engine: PolicyEngine) -> AsyncIterator[None]:
    """Disable the engine's adapters and report version 0 for the duration (see the module docstring)."""
    shared = engine if isinstance(engine, SharedModelEngine) else None
    layers = adapter_layers(engine)
    lock: Any = shared.weights_lock if shared is not None else nullcontext()
    was_disabled = [bool(layer.disable_adapters) for layer in layers]
    # peft's toggle also flips requires_grad of adapter weights: put each flag back as it was
    grads = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]
    version = engine.policy_version

    fold = shared.lora_fold if shared is not None else None  # the hf engine serves LoRA folded into the base weights

    def switch(to_base: bool) -> None:
        with lock:
            if fold is not None:
                fold.unfold()
            for layer, disabled in zip(layers, was_disabled):
                layer.enable_adapters(not to_base and not disabled)
            for param, flag in grads:
                param.requires_grad_(flag)
            if fold is not None and not to_base:
                fold.fold()
            engine.policy_version = 0 if to_base else version

    async def run(to_base: bool) -> None:
        if shared is not None:  # torch work on the engine's model runs on the engine's own thread
            await shared.on_worker(lambda: switch(to_base))
        else:
            await on_own_thread(switch, to_base)  # leaves no OpenMP team behind (torch_support)

    await run(True)
    try:
        yield
    finally:
        await run(False)


__all__ = ["adapter_layers", "base_policy"]
