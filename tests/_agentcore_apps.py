"""AgentCore apps for the deployed-runtime tests, written as the AgentCore docs teach (``BedrockAgentCoreApp``,
``@app.entrypoint``), made trainable with ``mtrl_integrations.agentcore.trainable``.

- ``tool_app``: the adapter tests' tool loop (``_adapter_tools``) as an async entrypoint answering JSON;
  it records what each rollout payload carried (``SEEN``: prompt, endpoint, session id).
- ``streaming_tool_app``: the same as an async generator (AgentCore answers it as server-sent events).
- ``answer_app``: the CLI tests' ``ANSWER 42`` agent (``_eval_agents.chat_loop``), rewarded 1 for ``ANSWER 42``.
- ``plain_stream_app``: not wrapped: it hands the rollout to a ``@rollout`` episode itself and streams plain events, with no result event;
  a task that says "break the stream" raises before its episode (the app ends the stream with an error event).
- ``slow_app``: one model call, then longer than the rollout's deadline.
- ``failing_app``: not wrapped: raises, so the app answers 500 (the service reports a RuntimeClientError).
"""

from __future__ import annotations

from typing import Any

import openai
from bedrock_agentcore import BedrockAgentCoreApp

from _adapter_tools import aopenai_tool_loop, finish_episode
from mtrl_adapters import aupdate_reward, context_from_request, current_rollout, rollout, rollout_scope
from mtrl_integrations.agentcore import trainable

SEEN: list[dict[str, Any]] = []


def _client() -> Any:
    return openai.AsyncOpenAI(api_key="sk-user-real-key", max_retries=0)


def tool_app() -> BedrockAgentCoreApp:
    app = BedrockAgentCoreApp()

    @app.entrypoint
    @trainable
    async def invoke(payload, context):
        ctx = current_rollout()
        if ctx is None:  # a user's invocation
            return {"echo": payload}
        SEEN.append({"prompt": payload.get("prompt"), "endpoint": payload["metadata"]["endpoint"],
                     "session": context.session_id, "rollout_id": ctx.rollout_id})
        turns = await aopenai_tool_loop(_client(), ctx.task)
        finish_episode(ctx.task, turns)
        return {"turns": turns}

    return app


def streaming_tool_app() -> BedrockAgentCoreApp:
    app = BedrockAgentCoreApp()

    @app.entrypoint
    @trainable
    async def invoke(payload):
        ctx = current_rollout()
        if ctx is None:
            yield {"echo": payload}
            return
        yield {"event": "started"}
        turns = await aopenai_tool_loop(_client(), ctx.task)
        finish_episode(ctx.task, turns)
        yield {"turns": turns}

    return app


def answer_app() -> BedrockAgentCoreApp:
    from _eval_agents import answer_score, chat_loop

    app = BedrockAgentCoreApp()

    @app.entrypoint
    @trainable
    async def invoke(payload):
        ctx = current_rollout()
        if ctx is None:
            return {"echo": payload}
        text = await chat_loop(ctx.task, [])
        reward, metrics = answer_score(text, ctx.task)
        await aupdate_reward(reward, metrics)
        return {"text": text}

    return app


def plain_stream_app() -> BedrockAgentCoreApp:
    app = BedrockAgentCoreApp()

    @rollout
    async def episode(task):
        turns = await aopenai_tool_loop(_client(), task)
        finish_episode(task, turns)
        return turns

    @app.entrypoint
    async def invoke(payload):
        ctx = context_from_request(payload)
        yield {"event": "accepted"}
        if "break the stream" in ctx.task.prompt:  # before the episode: nothing of the rollout reports its end
            raise RuntimeError("the stream broke before the episode")
        with rollout_scope(ctx):
            turns = await episode(ctx.task)
        yield {"event": "done", "turns": turns}

    return app


def slow_app(seconds: float) -> BedrockAgentCoreApp:
    """Opens its rollout with one model call, then works ``seconds`` more before answering."""
    import asyncio

    app = BedrockAgentCoreApp()

    @app.entrypoint
    @trainable
    async def invoke(payload):
        ctx = current_rollout()
        await _client().chat.completions.create(model="policy", messages=[{"role": "user", "content": ctx.task.prompt}])
        await asyncio.sleep(seconds)
        return {"late": True}

    return app


def failing_app() -> BedrockAgentCoreApp:
    app = BedrockAgentCoreApp()

    @app.entrypoint
    def invoke(payload):
        raise RuntimeError("the runtime's model configuration is missing")

    return app
