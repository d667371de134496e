"""Redirect every botocore ``bedrock-runtime`` client used inside a rollout to the coordinator.

Strands' ``BedrockModel`` and LangChain's ``ChatBedrockConverse`` talk to
Bedrock through a boto3 ``bedrock-runtime`` client, often one built before
any rollout and shared by all of them. ``instrument_bedrock()`` installs the
``redirect`` layer (``_patches``) on ``botocore.client.BaseClient._make_api_call``,
the one method every operation of every client goes through (selective
capture's layer sits outside it, so a call that passes by never gets here
with a rollout current): the first time a ``bedrock-runtime``
client makes a call inside a rollout, handlers are registered on that
client's own event system (``client.meta.events``). They act only while a
rollout is current, at each call:

* ``choose-signer``: the request is not signed (``botocore.UNSIGNED``), so
  the user's AWS credentials are never read for it, let alone sent;
* ``before-parameter-build``: ``inferenceConfig`` takes the rollout's
  sampling values (``maxTokens``, ``temperature``, ``topP``; the seed goes
  in ``additionalModelRequestFields.seed``), as chat completions do;
* ``before-send`` (registered last, so it runs after any handler of the
  user's or the framework's, such as Strands' ``api_key`` bearer header):
  the URL becomes ``{endpoint}/rollouts/{id}/model/...``, every credential
  header (``Authorization``, ``X-Amz-Security-Token``, ``X-Amz-Date``,
  ``X-Amz-Content-SHA256``) is removed, and ``Authorization: Bearer
  <rollout token>`` and ``x-mtrl-rollout-id`` are set.

Converse and ConverseStream are captured. ``InvokeModel`` and its streaming
variants speak each model's own body format, which mtrl cannot record: inside
a rollout they raise, naming the fix, rather than reach Bedrock unrecorded.
Other operations (``CountTokens``, ``ApplyGuardrail``) are left alone.
Outside a rollout the handlers do nothing, and a client never used inside
one gets none. Installed by the ``rollout`` decorator, never at import;
calling it again does nothing.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable
from urllib.parse import urlsplit

from ._context import RolloutContext, current_rollout
from ._patches import PATCHES, Patch
from .wire import HEADER_ROLLOUT_ID

SERVICE = "bedrock-runtime"
CAPTURED = ("Converse", "ConverseStream")
UNCAPTURED = ("InvokeModel", "InvokeModelWithResponseStream", "InvokeModelWithBidirectionalStream")
_CREDENTIAL_HEADERS = ("authorization", "x-amz-security-token", "x-amz-date", "x-amz-content-sha256",
                       HEADER_ROLLOUT_ID)
_ATTACH_LOCK = threading.Lock()
_ATTACHED = "_mtrl_bedrock_redirect"
_UNIQUE = "mtrl-bedrock-redirect"


class UncapturedBedrockCall(RuntimeError):
    """A Bedrock operation whose model call mtrl cannot record was made inside a rollout."""


def instrument_bedrock() -> bool:
    """Install the redirect if ``botocore.client`` is loaded, else the moment it is; True if installed now."""
    return PATCHES.install_when_imported((REDIRECT,))


def _redirecting(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _make_api_call(self: Any, operation_name: str, api_params: Any) -> Any:
        if current_rollout() is not None and is_bedrock_runtime(self):
            attach(self)
        return original(self, operation_name, api_params)

    return _make_api_call


REDIRECT = Patch("botocore.client:BaseClient", "_make_api_call", "redirect", _redirecting)


def is_bedrock_runtime(client: Any) -> bool:
    """Whether a botocore client is one of the Bedrock runtime service."""
    return client.meta.service_model.service_id.hyphenize() == SERVICE


def attach(client: Any) -> None:
    """Register the rollout redirect on one ``bedrock-runtime`` client (once; a no-op outside rollouts)."""
    if getattr(client, _ATTACHED, False):
        return
    with _ATTACH_LOCK:
        if getattr(client, _ATTACHED, False):
            return
        events = client.meta.events
        for operation in CAPTURED:
            events.register_first(f"choose-signer.{SERVICE}.{operation}", _unsigned,
                                  unique_id=f"{_UNIQUE}-sign-{operation}")
            events.register(f"before-parameter-build.{SERVICE}.{operation}", _rollout_sampling,
                            unique_id=f"{_UNIQUE}-params-{operation}")
        for operation in UNCAPTURED:
            events.register_first(f"before-parameter-build.{SERVICE}.{operation}", _refuse_uncaptured,
                                  unique_id=f"{_UNIQUE}-refuse-{operation}")
        # on the bare event name, registered last: the least specific handlers run last (botocore's order)
        events.register_last("before-send", _to_rollout, unique_id=f"{_UNIQUE}-send")
        setattr(client, _ATTACHED, True)


def _unsigned(**_: Any) -> Any:
    if current_rollout() is None:
        return None
    from botocore import UNSIGNED

    return UNSIGNED


def _rollout_sampling(params: dict[str, Any], **_: Any) -> None:
    """The rollout's sampling values in the call's parameters (copies: the caller's dicts stay as they were)."""
    ctx = current_rollout()
    if ctx is None or not ctx.sampling:
        return
    config = dict(params.get("inferenceConfig") or {})
    for name, key in (("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP")):
        if name in ctx.sampling:
            config[key] = ctx.sampling[name]
    params["inferenceConfig"] = config
    if ctx.sampling.get("seed") is not None:
        params["additionalModelRequestFields"] = {**(params.get("additionalModelRequestFields") or {}),
                                                  "seed": ctx.sampling["seed"]}


def _refuse_uncaptured(event_name: str, **_: Any) -> None:
    if current_rollout() is None:
        return
    operation = event_name.rsplit(".", 1)[-1]
    raise UncapturedBedrockCall(
        f"bedrock-runtime {operation} inside a rollout: mtrl records Bedrock's Converse API only (each model's "
        f"own InvokeModel body cannot be recorded token by token), so this call would go untrained; call the "
        "model through converse / converse_stream (Strands' BedrockModel and LangChain's ChatBedrockConverse do)"
    )


def _to_rollout(request: Any, event_name: str, **_: Any) -> None:
    ctx = current_rollout()
    if ctx is None:
        return
    parts = event_name.split(".")
    if len(parts) < 3 or parts[1] != SERVICE or parts[2] not in CAPTURED:
        return
    redirect_request(request, ctx)


def redirect_request(request: Any, ctx: RolloutContext) -> None:
    """Point one prepared request at the rollout, with the rollout's token and no AWS credential."""
    url = urlsplit(request.url)
    at = url.path.find("/model/")
    if at < 0:
        raise UncapturedBedrockCall(
            f"a bedrock-runtime request to {request.url!r} has no /model/ path; mtrl cannot route it"
        )
    query = f"?{url.query}" if url.query else ""
    request.url = f"{ctx.endpoint.rstrip('/')}/rollouts/{ctx.rollout_id}{url.path[at:]}{query}"
    for name in list(request.headers.keys()):
        if name.lower() in _CREDENTIAL_HEADERS or name.lower() == "host":
            del request.headers[name]
    request.headers["Authorization"] = f"Bearer {ctx.token}"
    request.headers[HEADER_ROLLOUT_ID] = ctx.rollout_id


__all__ = ["REDIRECT", "UncapturedBedrockCall", "attach",
           "instrument_bedrock", "is_bedrock_runtime", "redirect_request"]
