"""A reference model behind its own endpoint: the calls of an evaluation's reference side, passed through.

An evaluation can run the same agent, tasks and seeds on a reference model
(a frontier model: "what good looks like") besides the policy. The agent's
clients still reach the coordinator (the adapters redirect them as in any
rollout, whatever protocol they speak: OpenAI chat or Responses, Anthropic
Messages, Bedrock Converse); for a rollout created inside
``Coordinator.reference_side``, ``CallCapture`` sends each call on to the
reference's endpoint through a ``ReferenceClient`` and records the answer
as a ``Turn`` whose ``model`` is the reference's name and whose token ids
are empty: a closed endpoint gives none, and such a turn is never trained
on (``algorithms.samples`` refuses it).

The endpoint speaks one of the protocols of ``wires.WIRES`` that can be
called (``REFERENCE_WIRES``, by ``ReferenceModel.protocol``, each wire's
``reference_name``: ``openai``, ``responses``, ``anthropic``, ``bedrock``).
Each wire's calling module (``wires/<protocol>/_calling.py``) says what its
URL is, what it forwards and how it signs; this module is the HTTP client
and knows no protocol. The
agent's ``chat_template_kwargs`` (``enable_thinking``...) are variables of
the policy's own chat template: they are not sent, and counted
(``reference_template_kwargs_dropped``). The API key is read from an
environment variable (``api_key_env``) and never stored.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

import httpx

from ..tls import client_tls
from ..errors import BadRequest, EngineFailure, MtrlError, ServerBusy
from ..registry import Registry
from ..types import ChatOptions, SamplingParams
from ..wires import WIRES, CallingWire, ReferenceReply


def _reference_wires() -> Registry[CallingWire]:
    """The callable protocols of ``WIRES``, by the name a reference model's ``protocol`` takes."""
    wires: Registry[CallingWire] = Registry("reference protocol")
    for name in WIRES:
        wire = WIRES.get(name)
        if wire.calling is not None and wire.reference_name is not None:
            wires.register(wire.reference_name)(wire.calling)
    return wires


REFERENCE_WIRES = _reference_wires()

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BODY_SHOWN = 300  # characters of an endpoint's unexpected answer quoted in an error


@dataclass(frozen=True)
class ReferenceModel:
    """Where the reference model is: its endpoint's base URL and protocol, its model name, its key's env var."""

    url: str
    model: str
    api_key_env: str | None = None
    protocol: str = "openai"
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"reference url: expected an http(s) base URL such as https://api.openai.com/v1, "
                             f"got {self.url!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"reference model: expected the reference model's name, got {self.model!r}")
        key_env = self.api_key_env
        if key_env is not None and not (isinstance(key_env, str) and _ENV_NAME.match(key_env)):
            raise ValueError(f"reference api_key_env: expected an environment variable name, got {self.api_key_env!r}")
        if self.protocol not in REFERENCE_WIRES:
            raise ValueError(f"reference protocol: {self.protocol!r} is not supported; "
                             f"known: {', '.join(REFERENCE_WIRES)}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"reference timeout_s: expected seconds > 0, got {self.timeout_s!r}")

    @classmethod
    def coerce(cls, value: "ReferenceModel | Mapping[str, Any]") -> "ReferenceModel":
        """A ``ReferenceModel``, or one built from a mapping with its field names (unknown keys named)."""
        if isinstance(value, ReferenceModel):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"reference: expected a ReferenceModel or a mapping (url, model, api_key_env), "
                            f"got {value!r}")
        known = ("url", "model", "api_key_env", "protocol", "timeout_s")
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"reference: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        return cls(**value)

    @property
    def wire(self) -> CallingWire:
        return REFERENCE_WIRES.get(self.protocol)

    def api_key(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The key from ``api_key_env`` (None when no variable is named); a named variable that is unset is an error."""
        if self.api_key_env is None:
            return None
        key = environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"reference api_key_env: the environment variable {self.api_key_env} is not set "
                             f"(it should hold the API key for {self.url})")
        return key


class ReferenceClient:
    """Sends chat calls to a ``ReferenceModel``'s endpoint.

    Each request opens an HTTP client of its own: the calls arrive on the
    server's event loop, the check on the caller's, and an httpx client
    belongs to one loop. A connection per call costs milliseconds against
    a reference model's seconds.
    """

    def __init__(self, reference: ReferenceModel, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.reference = reference
        self._api_key = api_key
        self._transport = transport

    @property
    def model(self) -> str:
        return self.reference.model

    def _http(self, timeout_s: float) -> httpx.AsyncClient:
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        return httpx.AsyncClient(transport=self._transport, timeout=timeout, verify=client_tls())

    async def check(self) -> None:
        """Fail at once when the endpoint cannot be reached or refuses the key (a GET of its model list).

        Raises ``ConnectionError`` naming the URL. A 404 (no model list served) is accepted: the endpoint answered.
        A wire without a model list (``models_url`` None) is only connected to: any answer will do.
        """
        reference = self.reference
        wire, base = reference.wire, reference.url.rstrip("/")
        url = wire.models_url(base)
        try:
            async with self._http(min(reference.timeout_s, 30.0)) as http:
                response = await http.get(url or base, headers=wire.headers(self._api_key, "GET", url or base, b""))
        except httpx.HTTPError as exc:
            raise ConnectionError(f"reference url: cannot reach {reference.url} ({type(exc).__name__}: {exc}); "
                                  "check --reference-url and that the endpoint is up") from None
        if url is None:
            return
        if response.status_code in (401, 403):
            key = f"the key in ${reference.api_key_env}" if reference.api_key_env else "no API key"
            raise ConnectionError(f"reference url: {reference.url} refused {key} (HTTP {response.status_code}); "
                                  "set --reference-api-key-env to the variable holding its key")
        if response.status_code >= 500:
            raise ConnectionError(f"reference url: {reference.url} answered HTTP {response.status_code} to "
                                  f"its model list: {response.text[:_BODY_SHOWN]}")

    async def chat(self, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]], sampling: SamplingParams,
                   options: ChatOptions) -> ReferenceReply:
        """One answer of the reference model; an endpoint failure is an ``MtrlError`` naming the URL."""
        wire = self.reference.wire
        body = wire.request_body(self.reference.model, messages, tools, sampling, options)
        url = wire.chat_url(self.reference.url.rstrip("/"), self.reference.model)
        content = json.dumps(body, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", **wire.headers(self._api_key, "POST", url, content)}
        try:
            async with self._http(self.reference.timeout_s) as http:
                response = await http.post(url, content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise EngineFailure(f"the reference endpoint {url} failed: {type(exc).__name__}: {exc}",
                                param="model") from None
        if response.status_code != 200:
            raise _endpoint_error(url, response)
        try:
            return wire.parse_reply(response.json())
        except ValueError as exc:
            raise EngineFailure(f"the reference endpoint {url} answered what is not a {self.reference.protocol} "
                                f"reply ({exc}): {response.text[:_BODY_SHOWN]}", param="model") from None

    async def aclose(self) -> None:
        """Nothing held between calls (see the class docstring); kept so callers close what they open."""


async def check_reference(reference: ReferenceModel, api_key: str | None = None,
                          transport: httpx.AsyncBaseTransport | None = None) -> None:
    """``ReferenceClient.check``: ``ConnectionError`` naming the URL when it is unreachable or refuses the key."""
    await ReferenceClient(reference, api_key, transport).check()


def _endpoint_error(url: str, response: httpx.Response) -> MtrlError:
    """The agent's error for a refused call: 429 stays retryable (503), a 4xx is the request's (400), else 502."""
    text = f"the reference endpoint {url} answered HTTP {response.status_code}: {response.text[:_BODY_SHOWN]}"
    if response.status_code == 429:
        return ServerBusy(text, param="model")
    if 400 <= response.status_code < 500:
        return BadRequest(text, param="model")
    return EngineFailure(text, param="model")


__all__ = ["REFERENCE_WIRES", "ReferenceClient", "ReferenceModel", "ReferenceReply", "check_reference"]
