"""HTTP client from an agent to the coordinator's rollout routes.

Every request carries the rollout's own token. Errors come back as
:class:`RolloutError` with the coordinator's message, which names the field
and the value at fault. A request that could not be sent (connection
refused) is retried a few times; a request that was sent is not, so a
report is never recorded twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from typing import Any

import httpx
from pydantic import BaseModel

from .wire import (
    CompletionReport, ModelCallBatch, ModelCallReport, RewardReport, RolloutState, ToolCallBatch, ToolCallReport,
)

log = logging.getLogger("mtrl_adapters")

_SEND_RETRIES = 3  # attempts for requests that never left (connect errors)
_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class RolloutError(RuntimeError):
    """The coordinator refused a report, or could not be reached.

    ``status`` is the HTTP status (None when nothing was answered) and
    ``param`` the field the coordinator named.
    """

    def __init__(self, message: str, *, status: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One verified TLS context for the process (building one loads the CA bundle: ~20 ms)."""
    return ssl.create_default_context()


class CoordinatorClient:
    """Reports of one rollout: tool calls, reward, completion, and its state."""

    def __init__(
        self, endpoint: str, rollout_id: str, token: str, *, http: httpx.Client | httpx.AsyncClient | None = None
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.rollout_id = rollout_id
        self._headers = {"authorization": f"Bearer {token}"}
        self._http = http

    def _path(self, suffix: str = "") -> str:
        return f"{self.endpoint}/rollouts/{self.rollout_id}{suffix}"

    # ------------------------------------------------------------------ sync
    def report_reward(self, report: RewardReport) -> None:
        with self._session() as http:
            self._send(http, "POST", self._path("/reward"), report)

    def report_tool_calls(self, calls: list[ToolCallReport]) -> None:
        if calls:
            with self._session() as http:
                self._send(http, "POST", self._path("/tool_calls/batch"), ToolCallBatch(calls=calls))

    def send_tool_calls(self, calls: list[ToolCallReport]) -> None:
        """Post tool calls of a rollout still running (an adapter sending them as they end); a refusal is logged,
        as one of the calls sent at the close is."""
        with self._session() as http:
            self._post_tool_calls(http, calls)

    def _post_tool_calls(self, http: httpx.Client, calls: list[ToolCallReport]) -> None:
        """Post ``calls``; a refusal is logged, not raised (what is recorded stays recorded)."""
        _log_refusal(self._try(lambda: self._send(http, "POST", self._path("/tool_calls/batch"),
                                                  ToolCallBatch(calls=calls))))

    def close(self, calls: list[ToolCallReport], completion: CompletionReport,
              model_calls: list[ModelCallReport] | None = None) -> RolloutState:
        """Send the buffered tool calls and non-policy model calls, then the completion, over one connection."""
        with self._session() as http:
            if calls:
                self._post_tool_calls(http, calls)
            if model_calls:
                batch = ModelCallBatch(calls=model_calls)
                _log_refusal(self._try(lambda: self._send(http, "POST", self._path("/model_calls/batch"), batch)))
            return RolloutState.model_validate(self._send(http, "POST", self._path("/complete"), completion))

    def state(self) -> RolloutState:
        with self._session() as http:
            return RolloutState.model_validate(self._send(http, "GET", self._path(), None))

    # ------------------------------------------------------------------ async
    async def areport_reward(self, report: RewardReport) -> None:
        async with self._asession() as http:
            await self._asend(http, "POST", self._path("/reward"), report)

    async def aclose(self, calls: list[ToolCallReport], completion: CompletionReport,
                     model_calls: list[ModelCallReport] | None = None) -> RolloutState:
        async with self._asession() as http:
            for path, batch in (("/tool_calls/batch", ToolCallBatch(calls=calls) if calls else None),
                                ("/model_calls/batch", ModelCallBatch(calls=model_calls) if model_calls else None)):
                if batch is None:
                    continue
                try:
                    await self._asend(http, "POST", self._path(path), batch)
                except RolloutError as exc:
                    _log_refusal(exc)
            return RolloutState.model_validate(await self._asend(http, "POST", self._path("/complete"), completion))

    # ------------------------------------------------------------------ plumbing
    def _session(self) -> Any:
        if isinstance(self._http, httpx.Client):
            return _Borrowed(self._http)
        return httpx.Client(timeout=_TIMEOUT, verify=ssl_context())

    def _asession(self) -> Any:
        if isinstance(self._http, httpx.AsyncClient):
            return _Borrowed(self._http)
        # else a fresh client: an AsyncClient is bound to the loop it first ran on, and
        # agents run rollouts on loops of their own (Strands' sync bridge, AgentCore's worker)
        return httpx.AsyncClient(timeout=_TIMEOUT, verify=ssl_context())

    def _try(self, fn: Any) -> RolloutError | None:
        try:
            fn()
        except RolloutError as exc:
            return exc
        return None

    def _send(self, http: httpx.Client, method: str, url: str, body: BaseModel | None) -> Any:
        content = body.model_dump_json().encode() if body is not None else None
        headers = {**self._headers, "content-type": "application/json"} if content else self._headers
        for attempt in range(_SEND_RETRIES):
            try:
                response = http.request(method, url, content=content, headers=headers)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == _SEND_RETRIES - 1:
                    raise coordinator_unreachable(self.endpoint, exc) from None
                time.sleep(0.1 * 3**attempt)
            except httpx.HTTPError as exc:
                raise coordinator_unreachable(self.endpoint, exc) from None
        return coordinator_payload(response, f"rollout {self.rollout_id!r}")

    async def _asend(self, http: httpx.AsyncClient, method: str, url: str, body: BaseModel | None) -> Any:
        content = body.model_dump_json().encode() if body is not None else None
        headers = {**self._headers, "content-type": "application/json"} if content else self._headers
        for attempt in range(_SEND_RETRIES):
            try:
                response = await http.request(method, url, content=content, headers=headers)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt == _SEND_RETRIES - 1:
                    raise coordinator_unreachable(self.endpoint, exc) from None
                await asyncio.sleep(0.1 * 3**attempt)
            except httpx.HTTPError as exc:
                raise coordinator_unreachable(self.endpoint, exc) from None
        return coordinator_payload(response, f"rollout {self.rollout_id!r}")


class _Borrowed:
    """A shared client used as a (sync or async) context manager without closing it."""

    def __init__(self, http: Any) -> None:
        self.http = http

    def __enter__(self) -> Any:
        return self.http

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> Any:
        return self.http

    async def __aexit__(self, *exc: object) -> None:
        return None


def coordinator_payload(response: httpx.Response, subject: str | None = None) -> Any:
    """The JSON of a coordinator's answer; a refusal raised as ``RolloutError`` with its message, status and
    ``param`` (the message after ``"<subject>: "`` where a subject is given)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.is_success:
        return data
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or response.text)
        param = error.get("param")
    else:
        message, param = (response.text or response.reason_phrase), None
    raise RolloutError(message if subject is None else f"{subject}: {message}", status=response.status_code,
                       param=param)


def coordinator_unreachable(endpoint: str, exc: Exception) -> RolloutError:
    return RolloutError(f"could not reach the coordinator at {endpoint}: {type(exc).__name__}: {exc}")


def _log_refusal(exc: RolloutError | None) -> None:
    if exc is not None:
        log.warning("the coordinator refused this rollout's tool calls: %s", exc.message)


def describe_error(exc: BaseException, limit: int = 8000) -> str:
    """An exception as the text a failed rollout records: type, message, then the traceback's tail."""
    import traceback

    head = f"{type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (head + "\n\n" + trace[-(limit - len(head) - 2):])[:limit] if len(head) < limit else head[:limit]


__all__ = ["CoordinatorClient", "RolloutError", "coordinator_payload", "coordinator_unreachable", "describe_error",
           "ssl_context"]
