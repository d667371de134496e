"""aiobotocore ``bedrock-runtime`` clients inside a rollout: redirected like botocore's, with selective capture.

aiobotocore (async botocore: ``aioboto3``, some LangChain and Strands setups)
subclasses botocore's client and overrides ``_make_api_call`` with a
coroutine, so the wrapper ``instrument_bedrock`` puts on botocore's
``BaseClient._make_api_call`` never runs for it: without this module its
calls would reach Bedrock, signed, untrained. ``instrument_aiobotocore()``
puts the same two layers (``_patches``) on
``aiobotocore.client.AioBaseClient._make_api_call``, as coroutines. The
``redirect`` layer: the first call of a ``bedrock-runtime`` client inside a
rollout registers ``_bedrock.attach``'s handlers on the client's own event
system (aiobotocore emits botocore's events and runs plain handlers), so
Converse and ConverseStream are unsigned, pointed at the rollout and carry
its token, and ``InvokeModel*`` raises ``UncapturedBedrockCall``.

The ``selective`` layer, outside it, applies selective capture as for
botocore (``_selective``): with policy models named, a Converse call naming
another model runs with no rollout current (the handlers leave it alone: it
reaches its endpoint signed with the user's credentials) and is recorded as a non-policy call, with its token
usage when the answer says it (a stream's is not read). Installed by the
``rollout`` decorator when aiobotocore is installed; again, it does nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ._bedrock import attach, is_bedrock_runtime
from ._context import current_rollout
from ._patches import PATCHES, Patch
from ._selective import bedrock_passing, passing_by

_OWNER = "aiobotocore.client:AioBaseClient"


def instrument_aiobotocore() -> bool:
    """Install the async layers if ``aiobotocore.client`` is loaded, else the moment it is; True if installed now."""
    return PATCHES.install_when_imported(PATCHES_AIO)


def _selective(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _make_api_call(self: Any, operation_name: str, api_params: Any) -> Any:
        passing = bedrock_passing(self, operation_name, api_params)
        if passing is None:
            return await original(self, operation_name, api_params)
        with passing_by(*passing) as call:
            result = await original(self, operation_name, api_params)
        call.converse_usage(result)
        call.stream = isinstance(result, dict) and result.get("stream") is not None
        call.done()
        return result

    return _make_api_call


def _redirecting(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _make_api_call(self: Any, operation_name: str, api_params: Any) -> Any:
        if current_rollout() is not None and is_bedrock_runtime(self):
            attach(self)
        return await original(self, operation_name, api_params)

    return _make_api_call


PATCHES_AIO = (Patch(_OWNER, "_make_api_call", "selective", _selective),
               Patch(_OWNER, "_make_api_call", "redirect", _redirecting))

__all__ = ["PATCHES_AIO", "instrument_aiobotocore"]
