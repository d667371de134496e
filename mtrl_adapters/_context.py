"""The rollout context: which rollout the code running now belongs to.

One ``ContextVar`` holds the current :class:`RolloutContext`. asyncio tasks,
``asyncio.to_thread``, Strands' sync bridge and LangChain's executors copy
the context, so a model call or a tool call made anywhere below a rollout's
entrypoint is attributed to that rollout, however many rollouts share one
agent object, one compiled graph or one model client. The variable's
default is ``None``; per-rollout state lives on the context object that
each rollout gets for itself, never in a shared default.

Hand-off from an executor to a decorated agent function::

    with rollout_scope(spec):          # spec: a RolloutSpec, or a RolloutContext
        result = await agent(spec.task)  # @rollout opens, runs and closes the rollout
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from ._policy_rule import UnnamedPolicy
from ._values import MAX_RESULT_CHARS, jsonable, policy_model_ids, reward_report, sampling_fields
from .wire import CompletionReport, ModelCallReport, RolloutState, ToolCallReport, rollout_base_url, rollout_base_urls

_CURRENT: ContextVar["RolloutContext | None"] = ContextVar("mtrl_rollout", default=None)


@dataclass(frozen=True)
class AgentTask:
    """A task as an agent receives it: the fields of the coordinator's ``Task``.

    In-process executors hand the agent the coordinator's own ``Task``; an
    agent server builds this from the request's ``instance``, so agent code
    reads ``task.prompt`` / ``task.data`` the same way in both places.
    """

    id: str
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    ground_truth: Any = None
    split: str = "train"
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_instance(cls, instance: Mapping[str, Any], default_id: str) -> "AgentTask":
        """A task from a rollout request's ``instance``: Task-shaped, or any raw dataset row.

        Task-shaped: the Task's fields, plus (as ``HttpExecutor`` sends it) the
        entries of ``data`` repeated at the top level, the dataset row's own keys.
        """
        task_keys = {"id", "prompt", "messages", "ground_truth", "split", "data"}
        data = instance.get("data")
        row_keys = set(data) if isinstance(data, Mapping) else set()
        if set(instance) - task_keys <= row_keys and ("prompt" in instance or "messages" in instance):
            messages = instance.get("messages")
            return cls(
                id=str(instance.get("id") or default_id),
                prompt=instance.get("prompt"),
                messages=tuple(messages) if messages is not None else None,
                ground_truth=instance.get("ground_truth"),
                split=instance.get("split") or "train",
                data=dict(instance.get("data") or {}),
            )
        return cls(id=str(instance.get("id") or default_id), prompt=instance.get("prompt"), data=dict(instance))


@dataclass
class _OpenTool:
    """A tool call a framework announced and has not ended: what its record will hold."""

    name: str
    arguments: Any
    call_id: str | None
    source: str | None  # set at the start, or later by ``tool_source`` (an MCP server's name)
    wall: float  # time.time() at the start
    perf: float  # time.perf_counter() at the start, for the latency


@dataclass(eq=False)
class RolloutContext:
    """One rollout as the agent side knows it: ids, token, endpoint, task and limits.

    ``sampling`` holds the OpenAI request fields the coordinator wants every
    model call of this rollout to use (temperature, top_p, max_tokens, seed).
    ``http`` is an optional shared ``httpx.Client`` or ``httpx.AsyncClient``
    (a connection pool owned by an executor or agent server; an async one
    must belong to the loop the agent runs on); without it each report
    opens its own.
    """

    rollout_id: str
    token: str = field(repr=False)
    endpoint: str
    task: Any = None
    group_id: str | None = None
    model_name: str | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    timeout_s: float | None = None
    http: Any = field(default=None, repr=False)
    # the model ids whose calls are the policy's (None: every call is); see _selective for the rule
    policy_models: frozenset[str] | None = None
    # per-rollout state; guarded by _lock because tools may run on threads
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # one send of tool calls at a time, taken and posted under it: they reach the coordinator in the order they ended
    _send_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _claimed: bool = field(default=False, init=False, repr=False)
    _tool_calls: list[ToolCallReport] = field(default_factory=list, init=False, repr=False)
    _model_calls: list[ModelCallReport] = field(default_factory=list, init=False, repr=False)  # non-policy calls
    _open_tools: dict[Any, _OpenTool] = field(default_factory=dict, init=False, repr=False)
    _seen_keys: set[Any] = field(default_factory=set, init=False, repr=False)
    _textless: set[str] = field(default_factory=set, init=False, repr=False)  # failed calls buffered with no result
    # call ids whose tool failed in a way the framework does not tell its hooks (an MCP isError result)
    _failed_unsaid: set[str] = field(default_factory=set, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)  # the async owner's loop
    _pending: list[asyncio.Task] = field(default_factory=list, init=False, repr=False)
    # what the rule for unnamed policy models has seen of this rollout's calls (``_policy_rule``)
    unnamed_policy: UnnamedPolicy = field(default_factory=UnnamedPolicy, init=False, repr=False)
    # the agent runs tools no adapter sees (a CLI harness): the coordinator stores them from the conversation
    tool_calls_from_wire: bool = field(default=False, init=False)
    outcome: RolloutState | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not self.rollout_id:
            raise ValueError("rollout_id must be a non-empty string")
        if not self.endpoint or not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        if not self.token:
            raise ValueError(f"rollout {self.rollout_id!r}: token must be a non-empty string")
        self.policy_models = policy_model_ids(self.policy_models)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_spec(cls, spec: Any, *, http: Any = None) -> "RolloutContext":
        """A context from the coordinator's ``RolloutSpec`` (read by attribute; no runtime import)."""
        if isinstance(spec, RolloutContext):
            return spec
        return cls(
            rollout_id=spec.rollout_id,
            token=spec.token,
            endpoint=spec.endpoint,
            task=spec.task,
            group_id=spec.group_id,
            model_name=getattr(spec, "model_name", None),
            sampling=sampling_fields(getattr(spec, "sampling", None)),
            max_turns=getattr(spec, "max_turns", None),
            timeout_s=getattr(spec, "timeout_s", None),
            http=http,
            policy_models=getattr(spec, "policy_models", None),
        )

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url`` that attributes calls to this rollout by path."""
        return rollout_base_url(self.endpoint, self.rollout_id)

    def base_url_for(self, family: str) -> str:
        """The base URL an SDK of ``family`` (openai, anthropic, bedrock, gemini) takes as is for this rollout."""
        urls = rollout_base_urls(self.endpoint, self.rollout_id)
        if family not in urls:
            raise ValueError(f"family: expected one of {', '.join(urls)}, got {family!r}")
        return urls[family]

    @property
    def closed(self) -> bool:
        """True once this rollout's end has been reported."""
        return self.outcome is not None

    def claim(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """The first caller to claim a context owns its lifecycle (opens and closes it).

        An async owner passes its event loop: reports made from that loop's
        thread with the sync API are then sent in the background (never
        blocking the loop, which may be the coordinator's own) and awaited
        before the rollout closes.
        """
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            self._loop = loop
            return True

    def owner_loop_running_here(self) -> bool:
        """True when the caller runs on the async owner's event loop (a blocking call would stall it)."""
        if self._loop is None:
            return False
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def defer(self, coroutine: Any) -> None:
        """Send a report in the background on the owner's loop, after those deferred before; :meth:`drain` awaits it.

        The reports leave one after another, so the coordinator records them in
        the order the agent made them (a later reward replaces an earlier one):
        sent at once, on connections of their own, they could arrive swapped.
        """
        previous = self._pending[-1] if self._pending else None
        self._pending.append(asyncio.get_running_loop().create_task(_after(previous, coroutine)))

    async def drain(self) -> list[BaseException]:
        """Await the background reports; returns the errors they raised."""
        pending, self._pending = self._pending, []
        results = await asyncio.gather(*pending, return_exceptions=True)
        return [r for r in results if isinstance(r, BaseException)]

    # ------------------------------------------------------------------ tool calls
    def record_tool_call(
        self,
        name: str,
        arguments: Any = None,
        *,
        result: Any = None,
        error: str | None = None,
        latency_s: float = 0.0,
        call_id: str | None = None,
        started_at: float | None = None,
        source: str | None = None,
        awaits_text: bool = True,
    ) -> None:
        """Buffer one tool call; the buffer is sent when the rollout closes, or before by :meth:`send_tool_calls`.

        The coordinator places the call on the turn whose reply carried
        ``call_id`` (so buffering does not blur which turn it belongs to).
        ``source`` says where the tool ran (``"mcp:<server>"``; None: the agent's own tool).
        ``awaits_text``: a failed call with no result and a ``call_id`` waits for the text the framework sends
        the model in its place (:meth:`fill_tool_result`); False when the caller has said all there is (the
        agent's own tool loop), so :meth:`send_tool_calls` need not hold it.
        """
        report = ToolCallReport(
            name=name,
            arguments=jsonable(arguments),
            call_id=call_id,
            result=jsonable(result),
            error=None if error is None else str(error)[:MAX_RESULT_CHARS],
            status="error" if error is not None else "success",
            latency_s=max(float(latency_s), 0.0),
            started_at=started_at if started_at is not None else time.time() - max(float(latency_s), 0.0),
            source=source,
        )
        with self._lock:
            self._tool_calls.append(report)
            if call_id is not None:  # a later attempt of the same call (a retry) is the one the model read
                self._textless.discard(call_id)
                if awaits_text and report.status == "error" and report.result is None:
                    self._textless.add(call_id)

    @property
    def failed_calls_without_result(self) -> frozenset[str]:
        """The call ids of buffered failed calls recorded with no result (their tool raised): for
        :meth:`fill_tool_result` once the framework says what the model read instead."""
        with self._lock:
            return frozenset(self._textless)

    def fill_tool_result(self, call_id: str, result: Any) -> bool:
        """Give a buffered failed call that has no result the text the framework sent the model in its place
        (LangGraph's ToolNode turns a raised exception into a ToolMessage); False if there is no such call."""
        with self._lock:
            if call_id not in self._textless:
                return False
            self._textless.discard(call_id)
            for i in range(len(self._tool_calls) - 1, -1, -1):
                report = self._tool_calls[i]
                if report.call_id == call_id and report.status == "error" and report.result is None:
                    self._tool_calls[i] = report.model_copy(update={"result": jsonable(result)})
                    return True
        return False

    def tool_started(
        self, key: Any, name: str, arguments: Any, call_id: str | None = None, source: str | None = None
    ) -> bool:
        """Note the start of a tool call a framework announced; False if ``key`` was seen before.

        ``key`` is the framework's own id for the call (LangChain run id,
        Strands toolUseId), so a handler attached twice records it once.
        """
        with self._lock:
            if key in self._seen_keys:
                return False
            self._seen_keys.add(key)
            self._open_tools[key] = _OpenTool(name, arguments, call_id, source, time.time(), time.perf_counter())
            return True

    def note_tool_failed(self, call_id: str) -> None:
        """Note that call ``call_id`` failed where its framework's hooks will not say so (an MCP ``isError``
        result the OpenAI Agents SDK turns into text); :meth:`take_tool_failed` reads it once."""
        with self._lock:
            self._failed_unsaid.add(call_id)

    def take_tool_failed(self, call_id: str | None) -> bool:
        """Whether :meth:`note_tool_failed` noted ``call_id`` (forgotten once read)."""
        with self._lock:
            if call_id not in self._failed_unsaid:
                return False
            self._failed_unsaid.discard(call_id)
            return True

    def tool_source(self, key: Any, source: str) -> bool:
        """Say where an open call (:meth:`tool_started`) runs, once the tool itself says so (an MCP server's
        name, known only inside the call); False if ``key`` is not open."""
        with self._lock:
            opened = self._open_tools.get(key)
            if opened is None:
                return False
            opened.source = source
            return True

    def tool_finished(self, key: Any, *, result: Any = None, error: str | None = None) -> bool:
        """Record the end of a call started with :meth:`tool_started`; False if it was not open."""
        with self._lock:
            opened = self._open_tools.pop(key, None)
        if opened is None:
            return False
        self.record_tool_call(
            opened.name,
            opened.arguments,
            result=result,
            error=error,
            latency_s=time.perf_counter() - opened.perf,
            call_id=opened.call_id,
            started_at=opened.wall,
            source=opened.source,
        )
        return True

    def send_tool_calls(self, *, waiting_too: bool = False) -> None:
        """Send the buffered tool calls now, not at the rollout's end: a rollout stopped mid-way (its task
        cancelled, Ctrl-C, the run stopping) keeps every call that ended, and the run's progress counts them.

        Sent: the calls up to the first failed one still waiting for the text the model read in its place
        (:meth:`fill_tool_result`), so the coordinator stores them in the order they ended and each with its
        result; ``waiting_too`` sends those as well (the framework has moved on to a model call: no text will
        come). From the async owner's loop the post runs on a worker thread, after the reports deferred before
        it (:meth:`defer`; :meth:`drain` awaits it), never blocking the loop; elsewhere it blocks the caller.
        A refusal is logged, as one at the rollout's end is.
        """
        with self._lock:
            if not self._ready(waiting_too):
                return
        if self.owner_loop_running_here():
            self.defer(asyncio.to_thread(self._send_ready, waiting_too))
        else:
            self._send_ready(waiting_too)

    def _ready(self, waiting_too: bool) -> int:
        """How many buffered calls, from the front, :meth:`send_tool_calls` may send now (the caller holds
        ``_lock``)."""
        if waiting_too:
            return len(self._tool_calls)
        for i, report in enumerate(self._tool_calls):
            if report.call_id in self._textless and report.status == "error" and report.result is None:
                return i
        return len(self._tool_calls)

    def _send_ready(self, waiting_too: bool) -> None:
        with self._send_lock:  # taken and posted as one step: a send racing this one cannot overtake it
            with self._lock:
                count = self._ready(waiting_too)
                calls, self._tool_calls = self._tool_calls[:count], self._tool_calls[count:]
                if waiting_too:
                    self._textless.clear()
            if calls:
                self.client().send_tool_calls(calls)

    def take_tool_calls(self) -> list[ToolCallReport]:
        """The buffered tool calls, removed from the buffer."""
        with self._lock:
            calls, self._tool_calls = self._tool_calls, []
            self._textless.clear()
        return calls

    # ------------------------------------------------------------------ non-policy model calls
    def record_model_call(self, report: ModelCallReport) -> None:
        """Buffer one model call that passed through to its own endpoint; sent when the rollout closes."""
        with self._lock:
            self._model_calls.append(report)

    def take_model_calls(self) -> list[ModelCallReport]:
        """The buffered non-policy model calls, removed from the buffer."""
        with self._lock:
            calls, self._model_calls = self._model_calls, []
        return calls

    # ------------------------------------------------------------------ reports
    def client(self) -> "Any":
        from ._client import CoordinatorClient

        return CoordinatorClient(self.endpoint, self.rollout_id, self.token, http=self.http)

    def update_reward(self, reward: Any, metrics: Mapping[str, float] | None = None) -> None:
        """Report this rollout's reward (a float) or per-turn rewards (a list of floats)."""
        self.client().report_reward(reward_report(reward, metrics))

    async def aupdate_reward(self, reward: Any, metrics: Mapping[str, float] | None = None) -> None:
        """:meth:`update_reward` without blocking the event loop."""
        await self.client().areport_reward(reward_report(reward, metrics))

    @property
    def refusal(self) -> str | None:
        """Why a model call of this rollout was refused as ambiguous (``_policy_rule``): the rollout must end
        failed with it, whatever the agent did with the error. None: no call was."""
        return self.unnamed_policy.refusal

    def _completion(self, status: str, error: str | None) -> CompletionReport:
        return CompletionReport(status=status, error=error, flags=self.unnamed_policy.flags(),
                                tool_calls_from_wire=self.tool_calls_from_wire)

    def complete(self, status: str = "completed", error: str | None = None) -> RolloutState:
        """Send the buffered tool calls, then end the rollout; returns the coordinator's record."""
        with self._send_lock:  # after a send of tool calls in flight on another thread
            self.outcome = self.client().close(self.take_tool_calls(), self._completion(status, error),
                                               self.take_model_calls())
        return self.outcome

    async def acomplete(self, status: str = "completed", error: str | None = None) -> RolloutState:
        """:meth:`complete` without blocking the event loop."""
        report = self._completion(status, error)
        self.outcome = await self.client().aclose(self.take_tool_calls(), report, self.take_model_calls())
        return self.outcome

    def state(self) -> RolloutState:
        """The coordinator's view of this rollout now (status, turns, reward)."""
        return self.client().state()


async def _after(previous: "asyncio.Task[Any] | None", coroutine: Any) -> Any:
    """Await ``coroutine`` once ``previous`` has finished (its error is :meth:`RolloutContext.drain`'s to report)."""
    if previous is not None:
        await asyncio.wait({previous})
    return await coroutine


def current_rollout() -> RolloutContext | None:
    """The rollout the calling code runs in, or None outside any rollout."""
    return _CURRENT.get()


@contextlib.contextmanager
def rollout_scope(spec: Any, *, http: Any = None) -> Iterator[RolloutContext]:
    """Make ``spec`` the current rollout for the code inside the block.

    Executors and agent servers use this to hand a rollout to a function
    decorated with ``@rollout``, which then opens and closes it. ``spec`` is
    a ``RolloutSpec`` (read by attribute) or a :class:`RolloutContext`.
    """
    ctx = RolloutContext.from_spec(spec, http=http)
    reset = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(reset)


def activate(ctx: RolloutContext) -> Any:
    """Set ``ctx`` as current; returns the token for :func:`deactivate`."""
    return _CURRENT.set(ctx)


def deactivate(token: Any) -> None:
    _CURRENT.reset(token)


__all__ = [
    "AgentTask",
    "RolloutContext",
    "activate",
    "current_rollout",
    "deactivate",
    "rollout_scope",
]
