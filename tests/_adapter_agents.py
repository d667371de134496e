"""Agent processes for the remote adapter tests: ``python tests/_adapter_agents.py MODE [args]``.

- ``serve``: an OpenAI-client agent under mtrl's agent server (``start_agent_server``);
  prints ``URL <url> LIGHT <bool>`` (LIGHT: torch and the coordinator were not imported).
- ``agentcore``: the same agent as a ``BedrockAgentCoreApp`` entrypoint wrapped with
  ``mtrl_integrations.agentcore.trainable``, served by ``app.run()`` on 127.0.0.1.
- ``agentcore-stream``: the same agent as a streaming (async generator) entrypoint.
- ``sagemaker ENDPOINT``: a Strands agent written for SageMaker AI MTRL's adapters
  (``sagemaker_rft_handler``, ``wrap_model``, ``RolloutFeedbackClient``), no mtrl code,
  served by ``app.run()`` on 127.0.0.1; needs AWS credentials (dummy ones do: the
  SigV4 token is computed locally).
- ``sagemaker-shared ENDPOINT header|rollout``: the same with one ``wrap_model``-wrapped
  model shared at module level (SageMaker's docstring pattern), reading ``instance["answer"]``.
- ``sagemaker-langchain ENDPOINT``: a LangGraph agent (``create_react_agent``) on one
  module-level LangChain ``ChatOpenAI`` whose httpx clients come from SageMaker's LangChain
  adapter (``sagemaker.train.rft.adapters.langchain.create_http_clients``), as its docstrings
  teach; ``sagemaker_rft_handler`` and ``app.run()``, no mtrl code; reads ``instance["answer"]``.

With ``MTRL_TEST_SEEN`` set, the two SageMaker agents append what each rollout's agent
was answered to that file (``_note_seen``): the tests' ground truth of attribution.

Every ``app.run()`` listens on port 0 (a free port) and logs at info, so uvicorn's
``Uvicorn running on http://127.0.0.1:PORT`` line names the port it took.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _adapter_tools import (  # noqa: E402
    CRASH_KEY,
    add,
    aopenai_tool_loop,
    finish_episode,
    key_of,
    lookup,
    openai_tool_loop,
    per_turn_rewards,
)


def serve() -> None:
    import openai

    from mtrl_adapters import rollout, start_agent_server

    client = openai.OpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0)

    @rollout
    def agent(task):
        finish_episode(task, openai_tool_loop(client, task))
        return {"key": key_of(task.prompt)}

    server = start_agent_server(agent, "127.0.0.1", 0, background=False)
    light = not any(m in sys.modules for m in ("torch", "mtrl_runtime"))
    print(f"URL {server.url} LIGHT {light}", flush=True)
    server.serve_forever()


def agentcore() -> None:
    import openai
    from bedrock_agentcore import BedrockAgentCoreApp

    from mtrl_adapters import current_rollout, update_reward
    from mtrl_integrations.agentcore import trainable

    app = BedrockAgentCoreApp()
    client = openai.AsyncOpenAI(api_key="sk-user-real-key", max_retries=0)

    @app.entrypoint
    @trainable
    async def invoke(payload):
        ctx = current_rollout()
        if ctx is None:  # an ordinary invocation by a user
            return {"echo": payload}
        task = ctx.task
        turns = await aopenai_tool_loop(client, task)
        if key_of(task.prompt) == CRASH_KEY:
            raise RuntimeError("agent crashed on purpose")
        update_reward(per_turn_rewards(turns))
        return {"turns": turns}

    app.run(port=0, host="127.0.0.1", log_level="info")


def agentcore_stream() -> None:
    """The ``agentcore`` agent as a streaming entrypoint (an async generator AgentCore answers as events)."""
    import openai
    from bedrock_agentcore import BedrockAgentCoreApp

    from mtrl_adapters import current_rollout, update_reward
    from mtrl_integrations.agentcore import trainable

    app = BedrockAgentCoreApp()
    client = openai.AsyncOpenAI(api_key="sk-user-real-key", max_retries=0)

    @app.entrypoint
    @trainable
    async def invoke(payload):
        ctx = current_rollout()
        if ctx is None:  # an ordinary invocation by a user: streamed
            for word in ("streamed", "echo"):
                yield {"event": word}
            yield {"echo": payload}
            return
        yield {"event": "started"}
        task = ctx.task
        turns = await aopenai_tool_loop(client, task)
        if key_of(task.prompt) == CRASH_KEY:
            raise RuntimeError("agent crashed on purpose")
        update_reward(per_turn_rewards(turns))
        yield {"turns": turns}

    app.run(port=0, host="127.0.0.1", log_level="info")


def sagemaker(endpoint: str) -> None:
    from bedrock_agentcore import BedrockAgentCoreApp
    from sagemaker.core.token_generator import generate_token
    from sagemaker.train.rft import sagemaker_rft_handler
    from sagemaker.train.rft.adapters.strands import wrap_model
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    app = BedrockAgentCoreApp()
    tools = [tool(lookup), tool(add)]

    @app.entrypoint
    @sagemaker_rft_handler
    async def invoke(payload):
        # as SageMaker's docs write it; one model per call, since wrap_model writes its
        # headers into the model's shared client_args
        model = wrap_model(OpenAIModel(
            client_args={"api_key": generate_token(region="local"), "base_url": f"{endpoint}/v1"},
            model_id="policy",
        ))
        agent = Agent(model=model, tools=tools, callback_handler=None)
        try:
            await agent.invoke_async(payload["instance"]["prompt"])
        finally:
            _note_seen(payload["metadata"]["trajectory_id"], agent.messages)
        turns = sum(1 for m in agent.messages if m["role"] == "assistant")
        return {"reward": per_turn_rewards(turns)}

    app.run(port=0, host="127.0.0.1", log_level="info")


def sagemaker_shared(endpoint: str, url_mode: str) -> None:
    """SageMaker's docstring pattern: one ``wrap_model``-wrapped model at module level, shared by every rollout.

    ``url_mode`` ``header``: the model's base URL is the coordinator's ``/v1``
    (the trajectory header names the rollout); ``rollout``: the first request's
    ``model_endpoint``, kept for every later rollout. Reward: 1.0 when the
    final answer holds ``instance["answer"]`` (a dataset row's own key).
    """
    from bedrock_agentcore import BedrockAgentCoreApp
    from sagemaker.core.token_generator import generate_token
    from sagemaker.train.rft import sagemaker_rft_handler
    from sagemaker.train.rft.adapters.strands import wrap_model
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    app = BedrockAgentCoreApp()
    tools = [tool(lookup), tool(add)]
    model = wrap_model(OpenAIModel(
        client_args={"api_key": generate_token(region="local"), "base_url": f"{endpoint}/v1"}, model_id="policy",
    ))

    @app.entrypoint
    @sagemaker_rft_handler
    async def invoke(payload):
        if url_mode == "rollout" and model.client_args["base_url"] == f"{endpoint}/v1":
            model.client_args["base_url"] = payload["model_endpoint"]  # the first rollout's URL, from now on
        instance = payload["instance"]
        agent = Agent(model=model, tools=tools, callback_handler=None)
        try:
            result = await agent.invoke_async(instance["prompt"])
        finally:
            _note_seen(payload["metadata"]["trajectory_id"], agent.messages)
        if key_of(instance["prompt"]) == CRASH_KEY:
            raise RuntimeError("agent crashed on purpose")
        return {"reward": 1.0 if f"is {instance['answer']}" in str(result) else 0.0}

    app.run(port=0, host="127.0.0.1", log_level="info")


def sagemaker_langchain(endpoint: str) -> None:
    """SageMaker's LangChain adapter, unmodified: its header-injecting httpx clients under one shared ChatOpenAI.

    The handler is synchronous (``graph.invoke``: the adapter's sync ``httpx.Client``): the adapter's async client
    registers a plain function as an ``httpx.AsyncClient`` request hook, which httpx awaits, so every async call
    fails before it is sent, against any server (``test_adapters_sagemaker_langchain``'s last test shows it)."""
    from bedrock_agentcore import BedrockAgentCoreApp
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import ToolNode, create_react_agent
    from sagemaker.core.token_generator import generate_token
    from sagemaker.train.rft import sagemaker_rft_handler
    from sagemaker.train.rft.adapters.langchain import create_http_clients

    app = BedrockAgentCoreApp()
    http_client, async_client = create_http_clients()
    llm = ChatOpenAI(model="policy", base_url=f"{endpoint}/v1", api_key=generate_token(region="local"),
                     http_client=http_client, http_async_client=async_client, max_retries=0)
    # a tool's exception goes back to the model as its result (LangGraph's documented handle_tool_errors)
    graph = create_react_agent(llm, tools=ToolNode([tool(lookup), tool(add)], handle_tool_errors=True))

    @app.entrypoint
    @sagemaker_rft_handler
    def invoke(payload):
        instance = payload["instance"]
        state = {"messages": []}
        try:
            state = graph.invoke({"messages": [("user", instance["prompt"])]})
        finally:
            _note_seen_langchain(payload["metadata"]["trajectory_id"], state["messages"])
        if key_of(instance["prompt"]) == CRASH_KEY:
            raise RuntimeError("langgraph agent crashed on purpose")
        answer = str(state["messages"][-1].content)
        return {"reward": 1.0 if f"is {instance['answer']}" in answer else 0.0}

    app.run(port=0, host="127.0.0.1", log_level="info")


def _note_seen_langchain(trajectory: str, messages: list) -> None:
    """``_note_seen`` for LangChain messages: the AI messages' tool-call ids and text."""
    import json
    import os

    path = os.environ.get("MTRL_TEST_SEEN")
    if not path:
        return
    replies = [m for m in messages if getattr(m, "type", None) == "ai"]
    seen = {"rollout_id": trajectory.split(".")[0],
            "tool_use_ids": [c["id"] for m in replies for c in (m.tool_calls or [])],
            "texts": [m.content for m in replies if isinstance(m.content, str) and m.content]}
    with open(path, "a") as f:
        f.write(json.dumps(seen) + "\n")


def _note_seen(trajectory: str, messages: list) -> None:
    """What this rollout's agent was answered (its tool-call ids, its replies' text), one JSON line in the file
    ``MTRL_TEST_SEEN`` names: the tests' ground truth of which replies reached which agent. Unset: nothing."""
    import json
    import os

    path = os.environ.get("MTRL_TEST_SEEN")
    if not path:
        return
    replies = [m for m in messages if m["role"] == "assistant"]
    seen = {
        "rollout_id": trajectory.split(".")[0],
        "tool_use_ids": [b["toolUse"]["toolUseId"] for m in replies for b in m["content"] if "toolUse" in b],
        "texts": [b["text"] for m in replies for b in m["content"] if "text" in b],
    }
    with open(path, "a") as f:
        f.write(json.dumps(seen) + "\n")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "serve":
        serve()
    elif mode == "agentcore":
        agentcore()
    elif mode == "agentcore-stream":
        agentcore_stream()
    elif mode == "sagemaker":
        sagemaker(sys.argv[2])
    elif mode == "sagemaker-shared":
        sagemaker_shared(sys.argv[2], sys.argv[3])
    elif mode == "sagemaker-langchain":
        sagemaker_langchain(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}; expected serve, agentcore, sagemaker, sagemaker-shared or "
                         "sagemaker-langchain")
