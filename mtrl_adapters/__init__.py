"""Make an existing agent trainable: the rollout decorator, update_reward, framework hooks.

Light by design: importing this package never imports torch, the
coordinator, ``openai``, Strands or LangChain. The framework adapters are
submodules that import their framework: ``mtrl_adapters.strands``,
``mtrl_adapters.langgraph``.

    from mtrl_adapters import rollout, update_reward

    @rollout
    async def agent(task):
        reply = await client.chat.completions.create(model="policy", messages=[...])
        update_reward(score(reply, task.ground_truth))
"""

from ._anthropic import instrument_anthropic
from ._bedrock import UncapturedBedrockCall, instrument_bedrock
from ._client import RolloutError, describe_error
from ._context import AgentTask, RolloutContext, current_rollout, rollout_scope
from ._decorator import RolloutTimeout, instrument, is_decorated, rollout
from ._gemini import instrument_gemini
from ._litellm import UncapturedLiteLLMCall, instrument_litellm
from ._openai import instrument_openai
from ._reward import aupdate_reward, record_tool_call, update_reward
from ._policy_rule import AmbiguousModelCalls, UnresolvedModelCall
from ._server import (
    AgentServer,
    ahandle_rollout_request,
    context_from_request,
    handle_rollout_request,
    rollout_result,
    serve_agent,
    start_agent_server,
)

__all__ = [
    "AgentServer",
    "AgentTask",
    "AmbiguousModelCalls",
    "RolloutContext",
    "RolloutError",
    "RolloutTimeout",
    "UncapturedBedrockCall",
    "UncapturedLiteLLMCall",
    "UnresolvedModelCall",
    "ahandle_rollout_request",
    "aupdate_reward",
    "context_from_request",
    "current_rollout",
    "describe_error",
    "handle_rollout_request",
    "instrument",
    "instrument_anthropic",
    "instrument_bedrock",
    "instrument_gemini",
    "instrument_litellm",
    "instrument_openai",
    "is_decorated",
    "record_tool_call",
    "rollout",
    "rollout_result",
    "rollout_scope",
    "serve_agent",
    "start_agent_server",
    "update_reward",
]
