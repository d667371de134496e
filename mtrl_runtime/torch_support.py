"""What this machine and a model's KV cache can do: the torch facts the engines and the trainer both ask,
and where torch work may run.

torch's CPU kernels run in an OpenMP team per calling thread, and the team
lives as long as its thread. Once two long-lived threads have had one, GNU
OpenMP spins only briefly between parallel regions and every small op
waits for its workers to wake up (``engines/hf/_worker.py`` has the
measurements): a run's torch work belongs on one long-lived thread (the hf
engine's worker, or the update thread), and what runs elsewhere goes on a
thread that ends with it (``on_own_thread``), whose team ends too.

Imports torch and transformers only when asked, so importing this module stays light.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slower."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private torch.cpu helpers
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def plain_kv_cache(model: Any) -> bool:
    """Whether ``model``'s cache is all plain full-attention layers, whose KV can be cut and re-stacked."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # no usable config: treat the cache as opaque
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def cache_of(layers: Any) -> Any:
    """A transformers ``DynamicCache`` holding ``layers`` (per layer ``(keys, values)``) as they are, no copy.

    The model's next forward concatenates its new columns to them, so a
    tensor given here may be a broadcast view or a leaf that collects
    gradients."""
    from transformers.cache_utils import DynamicCache

    layers = list(layers)
    cache = DynamicCache(ddp_cache_data=[(None, None)] * len(layers))  # plain DynamicLayers, filled below
    for cache_layer, (keys, values) in zip(cache.layers, layers):
        cache_layer.lazy_initialization(keys, values)
        cache_layer.keys, cache_layer.values = keys, values
    return cache


def settle_future(future: Any, result: Any, error: BaseException | None) -> None:
    """Give a future (asyncio's or concurrent's) its call's outcome: ``error`` raised if given, else ``result``.

    Called where a torch thread's work is handed back: ``on_own_thread``, the hf engine's jobs and calls.
    """
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def on_own_thread(fn: Callable[..., T], *args: Any, name: str = "mtrl-once") -> T:
    """``asyncio.to_thread`` on a new thread that ends with the call (the module docstring says why): for
    torch work off the run's torch thread, such as building a run or saving a checkpoint. The caller's
    context variables are copied, as ``to_thread`` does; a cancelled caller stops waiting, the call runs on."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(result: Any, error: BaseException | None) -> None:
        if not done.cancelled():
            settle_future(done, result, error)

    def run() -> None:
        try:
            result, error = context.run(fn, *args), None
        except BaseException as exc:  # handed to the caller, who re-raises it
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(deliver, result, error)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass

    threading.Thread(target=run, name=name).start()  # not a daemon: a save under way finishes before exit
    return await done


__all__ = ["cache_of", "cpu_has_native_bf16", "on_own_thread", "plain_kv_cache", "settle_future"]
