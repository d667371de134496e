"""Live rollouts: their creation, their secret tokens, finding the one a call is for, and their state machines."""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

from ..chat import ConversationState, normalize_tools
from ..errors import Conflict, Forbidden, RolloutNotFound, Unauthorized
from ..store import hash_token
from ..types import Rollout, RolloutEvent, RolloutHandle, Task, ToolCall, TrajectoryStore
from ._counters import CoordinatorCounters
from ._errors import client_data
from ._lifecycle import Ending, RolloutLife
from ..wires import arguments_object
from ._reference import ReferenceClient


class VerifiedToken(str):
    """A credential the server checked itself, good for one rollout (SageMaker-compat SigV4 with its MAC).

    Only server code makes one, after its own check; a token read from a
    request is always a plain ``str``, so HTTP can never forge this.
    """

    rollout_id: str

    def __new__(cls, rollout_id: str) -> "VerifiedToken":
        obj = super().__new__(cls, f"verified:{rollout_id}")
        obj.rollout_id = rollout_id
        return obj


def _text(content: object) -> str:
    """A tool message's content as the text the model read (text parts joined; anything else as JSON)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return json.dumps(content, ensure_ascii=False, default=str)


@dataclass
class LiveRollout:
    """A running rollout's in-memory state (dropped when the rollout ends)."""

    rollout_id: str
    task_id: str
    group_id: str
    token_hash: str
    policy_version: int
    max_turns: int
    step: int | None = None  # the training step whose batch it belongs to (None outside training)
    conversation: ConversationState | None = None
    previous: ConversationState | None = None  # the conversation before the last turn (a compaction's summary call)
    turns: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one model call at a time; the end waits for it
    call_turns: dict[str, int] = field(default_factory=dict)  # tool-call id -> the turn that asked for it
    answered_calls: set[str] = field(default_factory=set)  # the model's tool calls whose results a later call sent
    failed_results: set[str] = field(default_factory=set)  # tool calls whose result came flagged failed (status error)
    declared_tools: set[str] = field(default_factory=set)  # the tool names the agent's requests declared
    undeclared_calls: set[str] = field(default_factory=set)  # the model's calls to a name its request did not declare
    tool_calls_recorded: int = 0  # tool calls the agent's adapter reported under a declared name
    life: RolloutLife = field(default_factory=RolloutLife)
    last_seen: float = field(default_factory=time.monotonic)  # the last call or report (the serve-mode TTL reads it)
    reference: ReferenceClient | None = None  # set: a reference model answers its calls, not the policy
    base_model: bool = False  # its calls are answered with the engine's adapter switched off (``MixesBaseRows``)
    seed: int | None = None  # what its calls sample with when they name no seed (``CallCapture._seed``)
    prompt: str | None = None  # its task's prompt (or first user message): what its first call carries (``_owner``)
    agent_flags: dict[str, float] = field(default_factory=dict)  # what the agent's side noted (``CompletionReport``)
    unserved_tool_calls: int = 0  # calls that declared tools the policy is not offered (Responses' hosted tools)
    clamped_turns: int = 0  # turns served up to the cap below the max_tokens their call asked for
    calls: dict[str, tuple[str, str]] = field(default_factory=dict)  # tool-call id -> the model's (name, arguments)
    results: dict[str, str] = field(default_factory=dict)  # tool-call id -> the result text the agent sent back
    wire_tool_calls: bool = False  # store its tool calls from the wire at its end (``CompletionReport``)
    # roles (``roles``): each role's conversation extends its own turns; its segments numbered across the rollout
    role_conversations: dict[str, ConversationState] = field(default_factory=dict)
    role_segments: dict[tuple[str, int], int] = field(default_factory=dict)  # (role, its own segment) -> rollout's
    # the tasks of the model calls in flight while they await the engine or a reference endpoint (the rollout's
    # own call, and a harness's background calls beside it), and whether the run stopped the rollout: a stopped
    # rollout's end does not wait for a completion nobody will read (``_inflight``)
    generating: set[asyncio.Task] = field(default_factory=set)
    stopped: bool = False

    def role_segment(self, role: str, own: int) -> int:
        """The rollout's segment number of ``role``'s segment ``own``: one of its own, never another role's."""
        key = (role, own)
        if key not in self.role_segments:
            self.role_segments[key] = len(self.role_segments)
        return self.role_segments[key]

    def note_answers(self, messages: list[dict]) -> None:
        """Remember which of the model's tool calls the agent answered (a ``tool`` message naming its id), and
        which results were flagged failed (``status: error``; each call once, however many turns repeat it)."""
        for message in messages:
            if message.get("role") == "tool":
                call_id = str(message.get("tool_call_id"))
                if call_id in self.call_turns:
                    self.answered_calls.add(call_id)
                    self.results.setdefault(call_id, _text(message.get("content")))
                if message.get("status") == "error":
                    self.failed_results.add(call_id)

    def note_calls(self, calls: Iterable[dict], tools: Iterable[dict], turn_index: int) -> None:
        """Remember the turn each of the model's tool calls came from, and the calls to a tool name the turn's
        request did not declare (an agent framework answers those with a refusal; no tool of the agent runs)."""
        declared = {tool["function"]["name"] for tool in normalize_tools(tools)}
        self.declared_tools |= declared
        for call in calls:
            call_id = str(call.get("id"))
            self.call_turns[call_id] = turn_index
            self.calls[call_id] = (call["function"]["name"], call["function"].get("arguments") or "")
            if call["function"]["name"] not in declared:
                self.undeclared_calls.add(call_id)

    def note_reported(self, names: Iterable[str]) -> None:
        """Count the adapter's reports that can stand for a call the agent ran: those naming a declared tool (a
        refused call to an undeclared name, which an adapter may report too, stands for none)."""
        self.tool_calls_recorded += sum(name in self.declared_tools for name in names)

    def wire_calls(self) -> list[ToolCall]:
        """The tool calls the conversation shows ran (the model's call answered by a later request's result), in
        the order the model made them, as tool-call records (``wire_tool_calls``); refused undeclared names excluded."""
        out = []
        for call_id, turn in sorted(self.call_turns.items(), key=lambda kv: kv[1]):
            if call_id not in self.answered_calls or call_id in self.undeclared_calls:
                continue
            name, arguments = self.calls[call_id]
            args = arguments_object(arguments)  # JSON text parsed; what is not JSON kept as the model wrote it
            failed = call_id in self.failed_results
            out.append(ToolCall(self.rollout_id, name, args, call_id=call_id, result=self.results.get(call_id),
                                status="error" if failed else "success", turn_index=turn))
        return out

    @property
    def refused_tool_calls(self) -> int:
        """The model's calls to an undeclared tool name that the agent answered (with a refusal)."""
        return len(self.answered_calls & self.undeclared_calls)

    @property
    def unrecorded_tool_calls(self) -> int:
        """Tool calls the agent ran (their results reached the model) beyond those its adapter reported; a call to
        an undeclared name ran no tool, so it is not one (``refused_tool_calls`` counts those)."""
        return max(0, len(self.answered_calls - self.undeclared_calls) - self.tool_calls_recorded)


class LiveRollouts:
    """Creates rollouts and checks every caller's token against them; feeds their state machines.

    A rollout is held here from its creation until an event ends it; after
    that, lookups read the store. Thread-safe: rollouts are created from
    worker threads while the server's loop serves them.
    """

    def __init__(self, store: TrajectoryStore, counters: CoordinatorCounters, default_max_turns: int) -> None:
        self.store = store
        self.counters = counters
        self.default_max_turns = default_max_turns
        self._live: dict[str, LiveRollout] = {}
        self._lock = threading.Lock()
        self._task_lock = threading.Lock()

    def _put_task_once(self, task: Task) -> None:
        """Store ``task`` unless stored; a stored task is immutable: other content under its id is a 409."""
        stored = self.store.get_task(task.id)
        if stored is None:
            with client_data("task"):
                self.store.put_task(task)
            return
        if _task_content(stored) != _task_content(task):
            self.counters.task_conflicts += 1
            raise Conflict(
                f"task_id {task.id!r} is already stored with other content (prompt, messages, ground_truth, split "
                "or data); a stored task never changes: use a new task_id",
                param="task_id",
            )

    def create(
        self,
        task: Task,
        group_id: str | None,
        policy_version: int,
        *,
        step: int | None = None,
        max_turns: int | None = None,
        reference: ReferenceClient | None = None,
        base_model: bool = False,
        seed: int | None = None,
    ) -> RolloutHandle:
        """Register a rollout (durably) and return its id and token (``reference``: who answers its calls, when
        not the policy; ``base_model``: the policy's base, its adapter switched off)."""
        rollout_id = "r-" + secrets.token_hex(12)
        token = secrets.token_urlsafe(32)
        group_id = group_id or "g-" + secrets.token_hex(8)
        rollout = Rollout(
            id=rollout_id,
            task_id=task.id,
            group_id=group_id,
            policy_version=policy_version,
            step=step,
            created_at=time.time(),
        )
        with self._task_lock:  # one check-then-put at a time: two creators of a new id cannot both write it
            self._put_task_once(task)
        self.store.create_rollout(rollout, hash_token(token))
        live = LiveRollout(
            rollout_id=rollout_id,
            task_id=task.id,
            group_id=group_id,
            token_hash=hash_token(token),
            policy_version=policy_version,
            max_turns=max_turns or self.default_max_turns,
            step=step,
            reference=reference,
            base_model=base_model,
            seed=seed,
            prompt=_first_prompt(task),
        )
        with self._lock:
            self._live[rollout_id] = live
        self.counters.rollouts_created += 1
        return RolloutHandle(rollout_id=rollout_id, token=token, group_id=group_id, task=task)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._live)

    def get(self, rollout_id: str) -> LiveRollout | None:
        with self._lock:
            return self._live.get(rollout_id)

    def decide(self, rollout_id: str, event: RolloutEvent) -> tuple[LiveRollout, Ending] | None:
        """Feed ``event`` to the rollout's state machine; when it ends the rollout, the rollout leaves here."""
        with self._lock:
            live = self._live.get(rollout_id)
            if live is None:
                return None
            ending = live.life.decide(event)
            if ending is None:
                return None
            del self._live[rollout_id]
        return live, ending

    def check_token(self, rollout_id: str, expected_hash: str, token: str | None) -> None:
        if isinstance(token, VerifiedToken) and token.rollout_id == rollout_id:
            return
        if not token:
            raise Unauthorized(
                f"rollout {rollout_id!r}: missing token; send 'Authorization: Bearer <rollout token>'",
                param="authorization",
            )
        if not hmac.compare_digest(hash_token(token), expected_hash):
            self.counters.auth_rejected += 1
            raise Forbidden(f"rollout {rollout_id!r}: the token does not belong to this rollout", param="authorization")

    def check_access(self, rollout_id: str, token: str | None) -> None:
        """Refuse a caller without this rollout's token (live or ended) before anything is read; unknown ids raise."""
        live = self.get(rollout_id)
        expected = live.token_hash if live is not None else self.store.token_hash(rollout_id)
        if expected is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        self.check_token(rollout_id, expected, token)
        if live is not None:
            live.last_seen = time.monotonic()

    def idle_since(self, before: float) -> list[str]:
        """Live rollouts with no call or report since ``before`` (monotonic) and no call in flight."""
        with self._lock:
            return [r.rollout_id for r in self._live.values() if r.last_seen < before and not r.lock.locked()]

    def running(self, rollout_id: str, token: str | None) -> LiveRollout:
        """The running rollout, after checking its token; final or unknown rollouts raise."""
        live = self.get(rollout_id)
        if live is None:
            stored = self.ended(rollout_id, token)
            raise Conflict(
                f"rollout {rollout_id!r} has ended ({stored.status.value}); it takes no more calls", param="rollout_id"
            )
        self.check_token(rollout_id, live.token_hash, token)
        live.last_seen = time.monotonic()
        return live

    def ended(self, rollout_id: str, token: str | None) -> Rollout:
        """A rollout no longer live, from the store, after checking its token; an unknown id raises."""
        stored_hash = self.store.token_hash(rollout_id)
        if stored_hash is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        self.check_token(rollout_id, stored_hash, token)
        rollout = self.store.get_rollout(rollout_id, with_turns=False)
        assert rollout is not None
        return rollout


def _first_prompt(task: Task) -> str | None:
    """The text a rollout's first call carries as its first user message, when the agent sends the task as given."""
    if task.prompt is not None:
        return task.prompt
    return next((str(m.get("content")) for m in task.messages or () if m.get("role") == "user"), None)


def _task_content(task: Task) -> str:
    """A task's content as canonical JSON (tuples and lists alike, keys sorted), to compare a stored one."""
    fields = [task.prompt, task.messages, task.ground_truth, task.split, dict(task.data)]
    return json.dumps(fields, sort_keys=True, default=repr)


__all__ = ["LiveRollout", "LiveRollouts", "VerifiedToken"]
