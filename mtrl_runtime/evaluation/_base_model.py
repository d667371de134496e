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

import asyncio
from contextlib import asynccontextmanager, nullcontext
from typing import Any, AsyncIterator


def adapter_layers(engine: Any) -> list[Any]:
    """The peft tuner layers inside the engine's model (empty when it holds no adapter)."""
    model = getattr(engine, "model", None)
    if model is None or not hasattr(model, "modules"):
        return []
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a dependency of the runtime
        return []
    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@asynccontextmanager
async def base_policy(engine: Any) -> AsyncIterator[None]:
    """Disable the engine's adapters and report version 0 for the duration (see the module docstring)."""
    layers = adapter_layers(engine)
    lock = getattr(engine, "weights_lock", None) or nullcontext()
    was_disabled = [bool(layer.disable_adapters) for layer in layers]
    # peft's toggle also flips requires_grad of adapter weights: put each flag back as it was
    grads = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]
    version = engine.policy_version

    fold = getattr(engine, "lora_fold", None)  # the hf engine serves LoRA folded into the base weights

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

    on_worker = getattr(engine, "on_worker", None)  # the hf engine: torch work on its model runs on its thread

    async def run(to_base: bool) -> None:
        if on_worker is not None:
            await on_worker(lambda: switch(to_base))
        else:
            await asyncio.to_thread(switch, to_base)

    await run(True)
    try:
        yield
    finally:
        await run(False)


__all__ = ["adapter_layers", "base_policy"]
