"""Strands Agents: record every tool call of a rollout, and give each rollout its own Agent.

The agent's model needs no change: a Strands ``OpenAIModel`` talks through
an ``openai`` client, and a ``BedrockModel`` through a boto3 client, which
the ``rollout`` decorator redirects to the coordinator (any placeholder
credentials will do; they never leave the process). Tool calls are
recorded by :class:`MtrlHooks` from Strands'
``BeforeToolCallEvent`` / ``AfterToolCallEvent``; a tool that raises stays an
error result for the model, as Strands makes it, and is recorded with
status ``error``. A call Strands refuses without running a tool (a tool name
its pattern rejects, a batch a hook cancelled) fires neither of those; the
batch events ``BeforeToolsEvent`` / ``AfterToolsEvent`` (Strands 1.51 and
later) record it too, as an error with Strands' refusal as its text.
Each call is sent to the coordinator as it ends (``RolloutContext.send_tool_calls``),
not held to the rollout's end: a rollout cancelled, timed out or interrupted
mid-way keeps every call it completed, and the run's progress line counts
them as they happen.

Every Agent built inside a rollout gets :class:`MtrlHooks` by itself:
:func:`instrument_strands` (the ``rollout`` decorator calls it when Strands
is loaded) wraps ``Agent.__init__`` once, and the wrapper attaches the hooks
after Strands' own ``__init__`` when a rollout is current; outside one it
does nothing more than the original. So an existing function that builds
its Agent, decorated as it is, records its tool calls::

    @rollout
    def run(task):
        agent = Agent(model=OpenAIModel(...), tools=[lookup, add])
        update_reward(1.0 if "42" in str(agent(task.prompt)) else 0.0)

An Agent built before any rollout (at import, say) gets no hooks that way:
build it with :func:`agent_factory`, or :func:`attach` the hooks to it.
Strands Agents are not re-entrant either, so concurrent rollouts need one
Agent each, which a factory gives::

    make_agent = agent_factory(lambda: Agent(model=OpenAIModel(...), tools=[lookup, add]))

A registry holds one set of mtrl's callbacks however the hooks arrive
(``Agent(hooks=[MtrlHooks()])``, :func:`attach`, the factory, the wrapper),
so no call is recorded twice.

Importing this module imports ``strands``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

from strands import Agent
from strands.hooks import AfterToolCallEvent, BeforeToolCallEvent, HookProvider, HookRegistry

try:
    from strands.hooks import AfterToolsEvent, BeforeToolsEvent
except ImportError as exc:  # the rollout decorator imports this module whenever Strands is loaded: say the fix
    from importlib.metadata import version

    raise ImportError(f"mtrl records Strands tool calls with strands-agents 1.51 or later (BeforeToolsEvent); "
                      f"{version('strands-agents')} is installed: pip install 'strands-agents>=1.51'") from exc

from ._context import RolloutContext, current_rollout
from ._patches import PATCHES, Patch
from .mcp import declared_server_name, mcp_source, warn_unnamed

A = TypeVar("A")

_REGISTERED = "_mtrl_hooks"  # on a HookRegistry: the MtrlHooks whose callbacks it holds


class MtrlHooks(HookProvider):
    """Records each tool call (name, input, result, status, error, latency) on the current rollout."""

    def __init__(self) -> None:
        self._requested: dict[str, dict] = {}  # toolUseId -> the model's toolUse block, from BeforeToolsEvent
        self._ran: set[str] = set()  # toolUseIds a per-tool event saw (recorded there)

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Register the callbacks, unless ``registry`` holds an MtrlHooks' already (each call recorded once)."""
        if getattr(registry, _REGISTERED, None) is not None:
            return
        setattr(registry, _REGISTERED, self)
        registry.add_callback(BeforeToolsEvent, self.before_tools)
        registry.add_callback(BeforeToolCallEvent, self.before_tool_call)
        registry.add_callback(AfterToolCallEvent, self.after_tool_call)
        registry.add_callback(AfterToolsEvent, self.after_tools)

    def before_tools(self, event: BeforeToolsEvent) -> None:
        """Remember the batch's calls as the model made them (before Strands renames an invalid one)."""
        for block in event.message.get("content") or ():
            use = block.get("toolUse") if isinstance(block, dict) else None
            if use is not None and use.get("toolUseId"):
                self._requested[use["toolUseId"]] = dict(use)

    def _per_tool(self, event: BeforeToolCallEvent | AfterToolCallEvent) -> RolloutContext | None:
        """The rollout a per-tool event belongs to (None outside one), its call noted as seen by a per-tool event
        (so ``after_tools`` leaves it alone)."""
        ctx = current_rollout()
        if ctx is not None:
            self._ran.add(event.tool_use.get("toolUseId"))
        return ctx

    def before_tool_call(self, event: BeforeToolCallEvent) -> None:
        ctx = self._per_tool(event)
        if ctx is None:
            return
        use = event.tool_use
        ctx.tool_started(_key(use), use.get("name", "?"), use.get("input"), use.get("toolUseId"),
                         source=_source(event.selected_tool))

    def after_tool_call(self, event: AfterToolCallEvent) -> None:
        ctx = self._per_tool(event)
        if ctx is None:
            return
        use = event.tool_use
        self._requested.pop(use.get("toolUseId"), None)
        result, error = _outcome(event)
        if not ctx.tool_finished(_key(use), result=result, error=error):
            # a retried attempt (same toolUseId): Strands measured it for us
            ctx.record_tool_call(
                use.get("name", "?"),
                use.get("input"),
                result=result,
                error=error,
                latency_s=event.duration or 0.0,
                call_id=use.get("toolUseId"),
                source=_source(event.selected_tool),
            )
        ctx.send_tool_calls()

    def after_tools(self, event: AfterToolsEvent) -> None:
        """Record the batch's results no per-tool event saw: calls Strands refused (an invalid tool name, a
        cancelled batch), each an error whose text is the refusal the model read. The batch's ids are forgotten
        here, so a long-lived Agent's hooks hold none beyond the batch in flight."""
        ctx = current_rollout()
        for block in event.message.get("content") or ():
            result = block.get("toolResult") if isinstance(block, dict) else None
            call_id = result.get("toolUseId") if result is not None else None
            if call_id is None:
                continue
            use = self._requested.pop(call_id, {})
            if call_id in self._ran:
                self._ran.discard(call_id)
                continue
            if ctx is None:
                continue
            value = _content(result)
            ctx.record_tool_call(
                use.get("name", "?"),
                use.get("input"),
                result=value,
                error=str(value) if value not in (None, []) else "refused by Strands",
                latency_s=0.0,
                call_id=call_id,
            )
        if ctx is not None:
            ctx.send_tool_calls()


def attach(agent: A) -> A:
    """Add :class:`MtrlHooks` to a Strands Agent unless it has them; returns the agent."""
    agent.hooks.add_hook(MtrlHooks())  # type: ignore[attr-defined]  # a no-op on a registry that has them
    return agent


def agent_factory(factory: Callable[..., A]) -> Callable[..., A]:
    """Wrap a function that builds an Agent: each call returns a fresh Agent with :class:`MtrlHooks`."""

    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> A:
        return attach(factory(*args, **kwargs))

    return make


def instrument_strands() -> bool:
    """Give every Strands Agent built inside a rollout :class:`MtrlHooks`; True if installed now.

    Puts the ``hooks`` layer (``_patches``) on ``Agent.__init__`` once (the
    original is kept on the wrapper as ``__mtrl_original__``;
    :func:`uninstall_strands` puts it back). Strands offers no process-wide
    hook: its registry, and the ``AgentInitializedEvent`` it fires, belong to
    each Agent, made inside ``__init__``.
    """
    return PATCHES.install(HOOKS)


def uninstall_strands() -> bool:
    """Put Strands' own ``Agent.__init__`` back (for tests); True if the wrapper was installed."""
    return PATCHES.uninstall(HOOKS)


def _hooking(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if current_rollout() is not None:
            attach(self)

    return __init__


HOOKS = Patch(Agent, "__init__", "hooks", _hooking)


def _source(tool: Any) -> str | None:
    """Where a Strands tool runs: None for the agent's own; ``"mcp:<server>"`` for an ``MCPAgentTool``.

    An MCPAgentTool exists only once ``strands.tools.mcp`` is loaded, so an agent that never loaded it pays no
    import. Strands' MCPClient has no name, and keeps no record of the handshake: the name is the one the
    server declared, noted on the client's session by :func:`mtrl_adapters.mcp.instrument_mcp`.
    """
    module = sys.modules.get("strands.tools.mcp.mcp_agent_tool")
    if module is None or not isinstance(tool, module.MCPAgentTool):
        return None
    # the client's live session: Strands keeps it in a private attribute (tests/test_mcp_tools.py checks it)
    name = declared_server_name(getattr(tool.mcp_client, "_background_thread_session", None))
    if name is None:
        warn_unnamed("Strands MCPClient", "start the client (with client: / Agent(tools=[client])) inside the "
                     "rollout, or call mtrl_adapters.instrument() before starting it, so mtrl sees its initialize "
                     "handshake (an mcp 2.x client that negotiates without one cannot be named)")
    return mcp_source(name)


def _key(use: Any) -> tuple[str, Any]:
    return ("strands", use.get("toolUseId") or id(use))


def _outcome(event: AfterToolCallEvent) -> tuple[Any, str | None]:
    """The tool's result as JSON-able content, and its error text (None on success)."""
    result = event.result or {}
    value = _content(result)
    if event.exception is not None:
        return value, f"{type(event.exception).__name__}: {event.exception}"
    if event.cancel_message:
        return value, f"cancelled: {event.cancel_message}"
    if result.get("status") == "error":
        return value, str(value) if value not in (None, []) else "the tool returned an error"
    return value, None


def _content(result: Any) -> Any:
    """A Strands tool result's content as JSON-able data: its one block, or the list of them."""
    blocks = [_block(b) for b in result.get("content") or []]
    return blocks[0] if len(blocks) == 1 else blocks


def _block(block: Any) -> Any:
    if isinstance(block, dict):
        for kind in ("text", "json"):
            if kind in block:
                return block[kind]
    return block


__all__ = ["MtrlHooks", "agent_factory", "attach", "instrument_strands", "uninstall_strands"]
