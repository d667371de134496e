"""A loopback stand-in of the AgentCore Runtime data plane, to train a "deployed" runtime without AWS.

It serves the two calls mtrl makes, in the shapes of botocore's
``bedrock-agentcore`` service model: ``InvokeAgentRuntime`` (``POST
/runtimes/{url-encoded ARN}/invocations?qualifier=...``, the session id in
``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id``, the payload as the body)
and ``StopRuntimeSession``. Each runtime is a real ``BedrockAgentCoreApp``
served on its own loopback port, as the container is in AWS; the stand-in
checks the caller, then forwards the payload to the app's ``/invocations``
with the session headers and relays the answer (JSON, or the app's
server-sent events as they come)::

    with AgentCoreStandIn({ARN: app}) as service:
        client = boto3.client("bedrock-agentcore", region_name="us-west-2",
                              endpoint_url=service.endpoint_url, **service.credentials)

What it checks, as the service does: SigV4 (the ``Authorization`` header
is recomputed with botocore's signer from the known test credentials over
the request as received, and the body's hash with it), or for a runtime
``oauth`` names, ``Authorization: Bearer <its token>`` (a SigV4 call to
it, or the reverse, is refused as an authorization mismatch); the ARN and
qualifier name a runtime and endpoint it has (else
ResourceNotFoundException); the session id's length. Errors are the
service's: the error code in ``x-amzn-ErrorType`` and ``{"message": ...}``
with the status the service model gives the code. ``fail_next`` makes the
next calls fail with a code of your choice (ThrottlingException, say). An
app that answers non-2xx becomes a RuntimeClientError, as the service
reports a runtime's failure; StopRuntimeSession ends the session's
invocations still being answered. Every call is recorded
(``invocations``, ``stopped_sessions``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import parse_qs, unquote

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from mtrl_runtime.executors import parse_runtime_arn
from mtrl_runtime.server import ServerHandle, start_server

SERVICE = "bedrock-agentcore"
SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
REQUEST_ID_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Request-Id"
USER_ID_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-User-Id"
TEST_ACCESS_KEY_ID = "AKIAMTRLSTANDIN00001"
TEST_SECRET_ACCESS_KEY = "mtrl-stand-in-secret-key-not-an-aws-one"
_STATUS_FALLBACK = {"InvalidSignatureException": 403, "IncompleteSignatureException": 400}


@dataclass(frozen=True)
class Invocation:
    """One call the stand-in answered (or refused)."""

    operation: str  # InvokeAgentRuntime | StopRuntimeSession
    arn: str
    qualifier: str | None
    session_id: str | None
    auth: str  # sigv4 | bearer | none
    content_type: str | None
    accept: str | None
    user_id: str | None
    status: int
    error: str | None = None


class AgentCoreStandIn:
    """The AgentCore data plane on loopback (see the module docstring); a context manager."""

    def __init__(
        self,
        runtimes: Mapping[str, Any],
        *,
        oauth: Mapping[str, str] | None = None,
        endpoints: tuple[str, ...] = ("DEFAULT",),
        access_key_id: str = TEST_ACCESS_KEY_ID,
        secret_access_key: str = TEST_SECRET_ACCESS_KEY,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """``runtimes``: ARN -> the runtime's ASGI app (a ``BedrockAgentCoreApp``). ``oauth``: ARN -> the bearer
        token a runtime configured for OAuth accepts. ``endpoints``: the qualifiers every runtime has.
        ``host``/``port``: where the service listens (a free loopback port by default; another host's address
        when the caller is on another machine). The runtimes' own apps stay on loopback, as a container's port
        is reached only through the service."""
        self.arns = {arn: parse_runtime_arn(arn, "runtimes") for arn in runtimes}
        self.apps = dict(runtimes)
        self.oauth = dict(oauth or {})
        unknown = sorted(set(self.oauth) - set(self.apps))
        if unknown:
            raise ValueError(f"oauth: {unknown[0]!r} is not one of the runtimes")
        self.endpoints = endpoints
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.host, self.port = host, port
        self.invocations: list[Invocation] = []
        self.stopped_sessions: list[str] = []
        self._faults: deque[tuple[str, str]] = deque()
        self._inflight: dict[str, set[asyncio.Task]] = {}  # session id -> its invocations being answered
        self._lock = threading.Lock()
        self._containers: dict[str, ServerHandle] = {}
        self._server: ServerHandle | None = None
        self._http: httpx.AsyncClient | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "AgentCoreStandIn":
        for arn, app in self.apps.items():
            self._containers[arn] = start_server(app)
        # beyond loopback start_server wants the key the app checks: here every call must be signed with the
        # secret access key (or carry a runtime's bearer token), which _auth_problem checks on each request
        self._server = start_server(Starlette(routes=[
            Route("/runtimes/{rest:path}", self._handle, methods=["POST"]),
        ]), self.host, self.port, api_key=self.secret_access_key)
        return self

    def stop(self) -> None:
        if self._server is not None:
            if self._http is not None:
                asyncio.run_coroutine_threadsafe(self._http.aclose(), self._server.loop).result(10)
                self._http = None
            self._server.stop()
            self._server = None
        for handle in self._containers.values():
            handle.stop()
        self._containers.clear()

    def __enter__(self) -> "AgentCoreStandIn":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        """The service's URL, for boto3's ``endpoint_url`` (or ``advanced.agentcore.endpoint_url``)."""
        if self._server is None:
            raise RuntimeError("the stand-in is not started")
        return self._server.url

    @property
    def credentials(self) -> dict[str, str]:
        """The test credentials, as boto3's client arguments."""
        return {"aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key}

    def fail_next(self, code: str, message: str | None = None, times: int = 1) -> None:
        """Answer the next ``times`` InvokeAgentRuntime calls with the service error ``code``."""
        with self._lock:
            self._faults.extend([(code, message or f"{code} (injected by the stand-in)")] * times)

    # -- the service -------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        raw_path = request.scope["raw_path"].decode("latin-1")
        encoded, _, action = raw_path.removeprefix("/runtimes/").rpartition("/")
        operation = {"invocations": "InvokeAgentRuntime", "stopruntimesession": "StopRuntimeSession"}.get(action)
        arn = unquote(encoded)
        query = parse_qs(request.scope["query_string"].decode("latin-1"))
        qualifier = query.get("qualifier", [None])[0]
        headers = request.headers
        body = await request.body()
        seen = dict(operation=operation or action, arn=arn, qualifier=qualifier, session_id=headers.get(SESSION_HEADER),
                    content_type=headers.get("content-type"), accept=headers.get("accept"),
                    user_id=headers.get(USER_ID_HEADER))
        auth = "bearer" if headers.get("authorization", "").startswith("Bearer ") else (
            "sigv4" if headers.get("authorization") else "none")

        def refuse(code: str, message: str) -> Response:
            error = _error(code, message)
            self._record(Invocation(auth=auth, status=error.status_code, error=f"{code}: {message}", **seen))
            return error

        if operation is None:
            return refuse("UnknownOperationException", f"no operation at {raw_path}")
        if "/" in encoded or not encoded.startswith("arn%3A"):
            return refuse("ValidationException", f"the ARN in the path must be URL-encoded, got {encoded!r}")
        problem = self._auth_problem(request, arn, body)
        if problem is not None:
            return refuse(*problem)
        if arn not in self.apps:
            return refuse("ResourceNotFoundException", f"no agent runtime {arn}")
        if (qualifier or "DEFAULT") not in self.endpoints:
            return refuse("ResourceNotFoundException", f"no endpoint {qualifier!r} on agent runtime {arn}")
        session = headers.get(SESSION_HEADER)
        if operation == "StopRuntimeSession":
            if not session:
                return refuse("ValidationException", f"{SESSION_HEADER} is required")
            self.stopped_sessions.append(session)
            for task in self._inflight.get(session, ()):  # as the service does: the session's work ends with it
                task.cancel()
            self._record(Invocation(auth=auth, status=200, **seen))
            return Response(b"{}", media_type="application/json", headers={SESSION_HEADER: session})
        if session is not None and not 33 <= len(session) <= 256:
            return refuse("ValidationException", f"runtimeSessionId must be 33 to 256 characters, got {len(session)}")
        session = session or str(uuid.uuid4())
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
        if fault is not None:
            return refuse(*fault)
        task = asyncio.ensure_future(self._forward(arn, session, headers, body, auth, seen))
        self._inflight.setdefault(session, set()).add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # the server itself is stopping
            return refuse("RuntimeClientError", f"the runtime session {session} was stopped")
        finally:
            self._inflight[session].discard(task)
            if not self._inflight[session]:
                del self._inflight[session]

    async def _forward(self, arn: str, session: str, headers: Any, body: bytes, auth: str, seen: dict) -> Response:
        """POST the payload to the runtime's ``/invocations``; relay its JSON or its event stream."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        forwarded = {"content-type": headers.get("content-type", "application/json"), SESSION_HEADER: session,
                     REQUEST_ID_HEADER: str(uuid.uuid4())}
        if headers.get("accept"):
            forwarded["accept"] = headers["accept"]
        if headers.get(USER_ID_HEADER):
            forwarded[USER_ID_HEADER] = headers[USER_ID_HEADER]
        container = self._containers[arn]
        answer = await self._http.send(
            self._http.build_request("POST", container.url + "/invocations", content=body, headers=forwarded),
            stream=True,
        )
        if not answer.is_success:
            text = (await answer.aread()).decode("utf-8", errors="replace")[:1000]
            await answer.aclose()
            error = _error("RuntimeClientError", f"Received error ({answer.status_code}) from runtime: {text}")
            self._record(Invocation(auth=auth, status=error.status_code, error=text, **seen))
            return error
        self._record(Invocation(auth=auth, status=200, **seen))
        media = answer.headers.get("content-type", "application/json")
        out_headers = {SESSION_HEADER: session}
        if media.startswith("text/event-stream"):
            return StreamingResponse(_relay(answer), media_type=media, headers=out_headers)
        content = await answer.aread()
        await answer.aclose()
        return Response(content, media_type=media, headers=out_headers)

    def _auth_problem(self, request: Request, arn: str, body: bytes) -> tuple[str, str] | None:
        """Why the caller is not let in (an error code and message), or None."""
        authorization = request.headers.get("authorization", "")
        token = self.oauth.get(arn)
        if token is not None:
            if not authorization.startswith("Bearer "):
                return ("AccessDeniedException", "Authorization method mismatch: this agent runtime is configured "
                        "for OAuth (a JWT bearer token), the request was signed with SigV4 or not authorized")
            given = authorization.removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), token.encode()):
                return ("UnauthorizedException", "the bearer token is not valid for this agent runtime")
            return None
        if authorization.startswith("Bearer "):
            return ("AccessDeniedException", "Authorization method mismatch: this agent runtime is configured for "
                    "IAM (SigV4); the request carried a bearer token")
        return sigv4_problem(request.method, _url_as_signed(request), dict(request.headers), body,
                             self.access_key_id, self.secret_access_key, self.arns.get(arn))

    def _record(self, invocation: Invocation) -> None:
        with self._lock:
            self.invocations.append(invocation)


def sigv4_problem(method: str, url: str, headers: Mapping[str, str], body: bytes, access_key_id: str,
                  secret_access_key: str, arn: Any = None) -> tuple[str, str] | None:
    """Why a request's SigV4 ``Authorization`` header does not hold (an error code and message), or None.

    The signature is recomputed with botocore's own ``SigV4Auth`` over the
    headers the request says it signed, at the time it says it was signed,
    and compared in constant time; the body's SHA-256 is part of it, so a
    changed payload fails too. ``arn``: the runtime's parsed ARN, whose
    region the credential scope must name.
    """
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    lower = {k.lower(): v for k, v in headers.items()}
    authorization = lower.get("authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return ("IncompleteSignatureException", "the request is not signed with AWS Signature Version 4")
    try:
        fields = dict(part.strip().split("=", 1) for part in authorization.removeprefix("AWS4-HMAC-SHA256 ").split(","))
        key_id, date, region, service, terminal = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        given = fields["Signature"]
        amz_date = lower["x-amz-date"]
    except (KeyError, ValueError):
        return ("IncompleteSignatureException", f"the Authorization header is malformed: {authorization[:200]!r}")
    if not hmac.compare_digest(key_id.encode(), access_key_id.encode()):
        return ("UnrecognizedClientException", f"the security token included in the request is invalid ({key_id})")
    if service != SERVICE or terminal != "aws4_request" or not amz_date.startswith(date):
        return ("InvalidSignatureException", f"the credential scope {fields['Credential']!r} is not for {SERVICE}")
    if arn is not None and region != arn.region:
        return ("InvalidSignatureException", f"the request is signed for region {region!r}, the runtime is in "
                                             f"{arn.region!r}")
    if "host" not in signed or any(name not in lower for name in signed):
        return ("InvalidSignatureException", f"a signed header is missing from the request: {signed}")
    sha = lower.get("x-amz-content-sha256")
    if sha is not None and sha != hashlib.sha256(body).hexdigest():
        return ("InvalidSignatureException", "the payload's SHA-256 is not the one signed")
    request = AWSRequest(method=method, url=url, data=body, headers={name: lower[name] for name in signed})
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(access_key_id, secret_access_key), service, region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    if not hmac.compare_digest(expected.encode(), given.encode()):
        return ("InvalidSignatureException", "The request signature we calculated does not match the signature "
                                             "you provided. Check your AWS Secret Access Key and signing method.")
    return None


def _url_as_signed(request: Request) -> str:
    """The URL as the client signed it: scheme, the Host header, the raw (still encoded) path and query."""
    path = request.scope["raw_path"].decode("latin-1")
    query = request.scope["query_string"].decode("latin-1")
    return f"{request.url.scheme}://{request.headers['host']}{path}" + (f"?{query}" if query else "")


def _error(code: str, message: str) -> Response:
    """A service error as the rest-json protocol answers it, with the status the service model gives ``code``."""
    return Response(json.dumps({"message": message}).encode(), status_code=_status_of(code),
                    media_type="application/json", headers={"x-amzn-ErrorType": code})


@functools.lru_cache(maxsize=None)
def _status_of(code: str) -> int:
    import botocore.session

    model = botocore.session.get_session().get_service_model(SERVICE)
    try:
        return int(model.shape_for(code).metadata["error"]["httpStatusCode"])
    except Exception:  # noqa: BLE001 - a code the model does not declare (signature errors are generic AWS ones)
        return _STATUS_FALLBACK.get(code, 400)


async def _relay(answer: httpx.Response):
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    finally:
        await answer.aclose()


__all__ = ["AgentCoreStandIn", "Invocation", "TEST_ACCESS_KEY_ID", "TEST_SECRET_ACCESS_KEY", "sigv4_problem"]
