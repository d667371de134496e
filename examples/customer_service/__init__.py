"""Customer service: a LangGraph support agent resolves tickets with lookups and a per-ticket session.

Data, tools, the reference solver, prompts, the dense reward and the strict
evaluation import without LangChain; the agent itself is in
``examples.customer_service.agent`` (``run`` is its ``@rollout`` entrypoint).
"""

from .data import (
    POLICIES,
    REFUND_LIMITS,
    RESOLUTIONS,
    SEED,
    SPLIT_SIZES,
    case_id_for,
    example_instance,
    generate,
    load_instances,
    stale_files,
)
from .prompts import build_messages, example_messages, system_prompt
from .reward import FIELDS, REFUND_CHECK, checks, format_answer, format_ok, parse_final_output, reward, strict_score
from .solver import ReferenceEpisode, decide, solve
from .tools import SESSION_TOOLS, TOOL_ORDER, SupportSession, dispatch, lookup_tools, tool_specs

__all__ = [
    "FIELDS",
    "POLICIES",
    "REFUND_CHECK",
    "REFUND_LIMITS",
    "RESOLUTIONS",
    "ReferenceEpisode",
    "SEED",
    "SESSION_TOOLS",
    "SPLIT_SIZES",
    "SupportSession",
    "TOOL_ORDER",
    "build_messages",
    "case_id_for",
    "checks",
    "decide",
    "dispatch",
    "example_instance",
    "example_messages",
    "format_answer",
    "format_ok",
    "generate",
    "load_instances",
    "lookup_tools",
    "parse_final_output",
    "reward",
    "solve",
    "stale_files",
    "strict_score",
    "system_prompt",
    "tool_specs",
]
