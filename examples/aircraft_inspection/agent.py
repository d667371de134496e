"""The aircraft inspection agent, on Strands, made trainable with one decorator and one call.

The agent is an ordinary Strands Agent: the SOP as system prompt, the worked
example as earlier turns, the six fixture tools. ``@rollout`` points its
OpenAI model at mtrl's endpoint while a rollout runs; ``update_reward``
reports the dense per-field reward with per-field accuracy as metrics.

    mtrl train examples/aircraft_inspection/config.yaml
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import openai
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

from mtrl_adapters import rollout, update_reward
from mtrl_adapters.strands import agent_factory

from .prompts import build_messages
from .reward import FIELD_SETS, FIELDS, reward
from .tools import InspectionSession


def to_strands_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-format turns (after the system prompt) as Strands conversation messages."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "assistant":
            content: list[dict[str, Any]] = [{"text": message["content"]}] if message.get("content") else []
            for call in message.get("tool_calls") or []:
                fn = call["function"]
                content.append({"toolUse": {"toolUseId": call["id"], "name": fn["name"],
                                            "input": json.loads(fn["arguments"])}})
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            result = {"toolResult": {"toolUseId": message["tool_call_id"], "status": "success",
                                     "content": [{"text": message["content"]}]}}
            if out and out[-1]["role"] == "user" and "toolResult" in out[-1]["content"][0]:
                out[-1]["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
        else:
            out.append({"role": "user", "content": [{"text": message["content"]}]})
    return out


def fields_for(task: Any) -> tuple[str, ...]:
    """The answer fields a task asks for: its ``data.fields`` set name, else all six."""
    data = getattr(task, "data", None) or {}
    return tuple(FIELD_SETS[data["fields"]]) if "fields" in data else FIELDS


def make_client() -> openai.AsyncOpenAI:
    """The agent's own OpenAI client; during a rollout mtrl points its requests at the endpoint with the rollout's key."""
    return openai.AsyncOpenAI(api_key=os.environ.get("OPENAI_API_KEY", "unused"),
                              base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8731/v1"))


def make_model(client: openai.AsyncOpenAI) -> OpenAIModel:
    """The agent's model settings, on one client reused for every call of an episode.

    (Strands' other form, ``client_args``, builds a client, and with it a TLS
    context, for every model call: about 80 ms of CPU each on a 2-core
    machine.)
    """
    return OpenAIModel(client=client, model_id="policy", params={"max_tokens": 96})


def new_agent(task: Any, client: openai.AsyncOpenAI, with_examples: bool = True) -> Agent:
    """A fresh Agent for one episode, with its own tools (Strands Agents are not re-entrant), its model on ``client``."""
    messages = build_messages(task, with_examples=with_examples, fields=fields_for(task))
    system, *history, request = messages
    return Agent(
        model=make_model(client),
        system_prompt=system["content"],
        messages=to_strands_messages(history),
        tools=[tool(fn) for fn in InspectionSession().tools.values()],
        callback_handler=None,
        retry_strategy=None,
    )


make_agent = agent_factory(new_agent)


def turn_budget_spent(exc: BaseException) -> bool:
    """Whether ``exc`` is, or wraps, the endpoint's 409 for a rollout past its ``max_turns``.

    Strands raises the OpenAI client's error as is from the first model call
    and wrapped in an ``EventLoopException`` from the calls after a tool ran.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, openai.APIStatusError):
            return current.status_code == 409
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__
    return False


@rollout
async def run(task: Any) -> str:
    """One inspection episode: the agent works the SOP, then reports its reward."""
    try:
        async with make_client() as client:  # one client for the episode's calls, closed with it
            result = await make_agent(task, client).invoke_async(task.prompt)
        text = str(result)
    except MaxTokensReachedException:  # the reply hit the per-turn token cap: no valid answer
        text = ""
    except Exception as exc:
        if not turn_budget_spent(exc):
            raise
        text = ""  # the coordinator refused the turn after max_turns: score what was produced (nothing)
    score, metrics = reward(text, task.ground_truth, fields_for(task))
    update_reward(score, metrics)
    return text


__all__ = ["fields_for", "make_agent", "make_client", "make_model", "new_agent", "run", "to_strands_messages",
           "turn_budget_spent"]
