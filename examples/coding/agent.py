"""The coding agent: a plain ``openai`` client and a tool loop whose tools run in the rollout's sandbox.

Each episode opens its own sandbox (``rollout_sandbox()``: the kind the
run's ``advanced.sandbox`` names, bubblewrap by default), writes the
task's repository into its ``/workspace``, and lets the model read, write
and run commands there until it answers without a tool call (or
``max_turns`` model calls pass). Then, still in the sandbox, ``reward.score``
checks the work: the hidden test, and that no other file changed. The
sandbox and everything in it is removed when the episode ends, however it
ends. The hidden test is never in the workspace while the agent works.

Train it::

    mtrl train examples/coding/config.yaml --agent examples.coding.agent:run

While training, ``@rollout`` points the ``AsyncOpenAI`` client at the
policy being trained; because this agent runs its own tool loop, it
reports each tool call with ``record_tool_call``.
"""

from __future__ import annotations

from typing import Any, Callable

import openai

from mtrl_adapters import current_rollout, record_tool_call, rollout, update_reward
from mtrl_runtime.envs import to_json
from mtrl_runtime.sandboxes import Sandboxes, rollout_sandbox
from mtrl_runtime.types import Sandbox, Task

from .prompts import build_messages
from .reward import score
from .tools import TOOLS, call_tool, parse_arguments

DEFAULT_BASE_URL = "http://127.0.0.1:8731/v1"  # `mtrl serve` (used only outside training)
DEFAULT_MAX_TURNS = 10
MODEL = "policy"


def make_client() -> openai.AsyncOpenAI:
    """The agent's model client (one per episode: an async client belongs to the loop it first ran on)."""
    return openai.AsyncOpenAI(base_url=DEFAULT_BASE_URL, api_key="unused-while-training", max_retries=0)


def _max_turns() -> int:
    ctx = current_rollout()
    return ctx.max_turns if ctx is not None and ctx.max_turns else DEFAULT_MAX_TURNS


def _assistant_message(message: Any) -> dict[str, Any]:
    """The reply as the next request must send it back (so the endpoint extends the same sequence)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in message.tool_calls]
    return out


async def prepare(box: Sandbox, task: Task) -> None:
    """Write the task's repository into the sandbox's workspace."""
    for path, text in task.data["files"].items():
        await box.write_file(path, text)


async def _run_tool(box: Sandbox, call: Any) -> str:
    result = await call_tool(box, call.function.name, call.function.arguments)
    parsed = parse_arguments(call.function.arguments)
    record_tool_call(call.function.name, call.function.arguments if isinstance(parsed, str) else parsed,
                     result=result, error=result.get("error"), call_id=call.id)
    return to_json(result)


async def fix_repository(client: openai.AsyncOpenAI, box: Sandbox, task: Task, max_turns: int) -> tuple[str, bool]:
    """The tool loop: the final reply's text and whether it is a whole answer (not cut at ``max_tokens``), or
    ("", False) when ``max_turns`` calls end without one."""
    messages = build_messages(task)
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(_assistant_message(message))
        if not message.tool_calls:  # the answer; one cut at max_tokens does not count as one (completion 0)
            return message.content or "", response.choices[0].finish_reason != "length"
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": await _run_tool(box, call)})
    return "", False


def make_agent(client_factory: Callable[[], openai.AsyncOpenAI] = make_client, *,
               sandboxes: Sandboxes | None = None) -> Callable[..., Any]:
    """A ``@rollout`` entrypoint; ``sandboxes``: a provider of its own (default: the run's, from its config)."""

    @rollout
    async def run(task: Task) -> str:
        async with rollout_sandbox(sandboxes=sandboxes) as box:  # removed with everything in it, however it ends
            await prepare(box, task)
            async with client_factory() as client:
                text, answered = await fix_repository(client, box, task, _max_turns())
            found = await score(box, task.ground_truth) if task.ground_truth is not None else None
        if found is not None:
            update_reward(found.reward, {**found.metrics(), "completion": float(answered)})
            if found.problem:
                text += f"\n[scorer: {found.problem}]"
        return text

    return run


run = make_agent()
"""The entrypoint ``mtrl train --agent examples.coding.agent:run`` trains."""

__all__ = ["DEFAULT_BASE_URL", "MODEL", "fix_repository", "make_agent", "make_client", "prepare", "run"]
