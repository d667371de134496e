"""The fault catalog shared by tests/test_faults.py and bench/faults.py.

One agent and one scripted policy serve every fault; a task names its fault
in its prompt (``[fault:<name>]``) and in ``task.data["fault"]``, so one
batch can mix every fault with healthy rollouts. The healthy episode is two
turns: the model calls ``lookup``, the agent runs it and reports the call,
the model answers, the agent reports reward 1.0. Each fault breaks one
thing in that episode; ``EXPECTED`` says how the rollout must end.

The agent uses the plain ``openai`` async client with a fake provider key:
the ``@rollout`` decorator (applied by ``InProcessExecutor``) redirects it
to the coordinator.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from mtrl_runtime.engines import ScriptedReply
from mtrl_runtime.types import Task

USER_API_KEY = "sk-user-real-provider-key-never-forwarded"  # what a user's agent would hold
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
MALFORMED_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": K1\n</tool_call>'
_FAULT = re.compile(r"\[fault:(\w+)\]")


@dataclass(frozen=True)
class Expected:
    """How a rollout with this fault must end: status, a phrase of its error, and whether its group survives."""

    status: str
    error: str | None = None
    survives: bool = True  # under keep_survivors with min_survivors=1


EXPECTED: dict[str, Expected] = {
    "healthy": Expected("completed"),
    "agent_raises": Expected("failed", "agent crashed on purpose", survives=False),
    "agent_hangs": Expected("timed_out", "timeout_s", survives=False),
    "exceeds_max_turns": Expected("failed", "max_turns", survives=False),
    "malformed_tool_call": Expected("completed"),
    "reward_twice": Expected("completed"),
    "never_reports": Expected("completed"),
    "nan_reward": Expected("failed", "reward must be a finite number", survives=False),
    "engine_fails": Expected("failed", "the policy engine failed", survives=False),
    "engine_fails_once": Expected("completed"),  # the client's retry gets the turn
    "stream_engine_fails": Expected("failed", "the policy engine failed", survives=False),
    "tool_raises": Expected("completed"),
    "flaky_agent": Expected("failed", "agent crashed on purpose"),  # only the first rollout of each task fails
}
FAULTS = [name for name in EXPECTED if name != "healthy"]


def fault_task(fault: str, index: int = 0) -> Task:
    return Task(id=f"{fault}-{index}", prompt=f"[fault:{fault}] What is the value of key K1?", data={"fault": fault})


class FaultPolicy:
    """The scripted engine's policy: a lookup call, then an answer, broken where the fault says."""

    def __init__(self) -> None:
        self.attempts: dict[tuple[str | None, int], int] = defaultdict(int)

    def __call__(self, request: Any, prompt: str) -> ScriptedReply | str:
        match = _FAULT.search(prompt)
        fault = match.group(1) if match else "healthy"
        turn = request.turn_index
        self.attempts[(request.rollout_id, turn)] += 1
        first_attempt = self.attempts[(request.rollout_id, turn)] == 1
        if fault == "exceeds_max_turns":
            return ScriptedReply.tool_call("lookup", {"key": "K1"})
        if fault == "malformed_tool_call" and turn == 0:
            return MALFORMED_CALL
        if fault in ("engine_fails", "stream_engine_fails") and turn == 1:
            return ScriptedReply.fail("the engine broke mid-generation")
        if fault == "engine_fails_once" and turn == 1 and first_attempt:
            return ScriptedReply.fail("a transient engine failure")
        if fault == "stream_engine_fails":
            return "Working on it."
        if turn == 0:
            return ScriptedReply.tool_call("lookup", {"key": "K1"})
        return "The value of K1 is 10. DONE"


class FaultAgent:
    """The user's agent (async): an OpenAI tool loop that misbehaves where its task's fault says.

    One ``AsyncOpenAI`` client serves every rollout (made on first use, on
    the loop the rollouts run on); ``aclose`` closes it.
    """

    def __init__(self) -> None:
        self.started: dict[str, int] = defaultdict(int)  # rollouts started per task (for flaky_agent)
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(base_url="https://provider.invalid/v1", api_key=USER_API_KEY, max_retries=2)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __call__(self, task: Any) -> str:
        from mtrl_adapters import record_tool_call, update_reward

        fault = task.data["fault"]
        self.started[task.id] += 1
        first_of_task = self.started[task.id] == 1
        client = self.client()
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        for turn in range(100):
            if turn == 1 and fault == "agent_raises":
                raise RuntimeError("agent crashed on purpose")
            if turn == 1 and fault == "flaky_agent" and first_of_task:
                raise RuntimeError("agent crashed on purpose")
            if turn == 1 and fault == "agent_hangs":
                await asyncio.sleep(3600)
            message = await _ask(client, messages, stream=fault == "stream_engine_fails")
            messages.append(message)
            if fault == "stream_engine_fails" and turn == 0:
                messages.append({"role": "user", "content": "Go on."})
                continue
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                args = json.loads(call["function"]["arguments"])
                try:
                    if fault == "tool_raises":
                        raise KeyError(f"lookup failed for {args.get('key')}")
                    content, error = "10", None
                except KeyError as exc:
                    content, error = f"Error: {exc}", f"KeyError: {exc}"
                record_tool_call("lookup", args, result=None if error else content, error=error, call_id=call["id"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        if fault == "nan_reward":
            update_reward(float("nan"))
        elif fault == "reward_twice":
            update_reward(0.25)
            update_reward(1.0)
        elif fault != "never_reports":
            update_reward(1.0)
        return str(messages[-1].get("content"))


async def _ask(client: Any, messages: list[dict[str, Any]], *, stream: bool) -> dict[str, Any]:
    """One model call; a streamed reply is assembled from its text chunks."""
    if not stream:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        return reply.choices[0].message.model_dump(exclude_none=True)
    chunks = await client.chat.completions.create(model="policy", messages=messages, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    return {"role": "assistant", "content": text}


def fault_of(task_id: str) -> str:
    return task_id.rsplit("-", 1)[0]


__all__ = ["EXPECTED", "FAULTS", "Expected", "FaultAgent", "FaultPolicy", "USER_API_KEY", "fault_of", "fault_task"]
