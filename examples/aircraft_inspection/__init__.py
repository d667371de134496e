"""Aircraft inspection: an agent follows an SOP with six tools and answers six fields.

Data, tools, the reference solver, prompts, the dense reward and the strict
evaluation. The agent wiring (Strands / LangGraph / OpenAI client) builds on
``build_messages``, ``TOOL_SPECS``, ``dispatch`` and ``reward``.
"""

from .data import DEFAULT_EXAMPLE, EXAMPLE_STATES, SEED, SPLIT_SIZES, example_instance, generate, load_instances
from .prompts import build_messages, example_messages, system_prompt
from .reward import (
    FIELD_SETS,
    FIELD_VALUES,
    FIELDS,
    format_answer,
    lenient_parse,
    lenient_reward,
    parse_final_output,
    reward,
    strict_score,
)
from .solver import ReferenceEpisode, parse_kv, solve
from .tools import CHECKS, SOP_ORDER, TOOL_SPECS, InspectionSession, dispatch

__all__ = [
    "CHECKS",
    "DEFAULT_EXAMPLE",
    "EXAMPLE_STATES",
    "FIELDS",
    "FIELD_SETS",
    "FIELD_VALUES",
    "InspectionSession",
    "ReferenceEpisode",
    "SEED",
    "SOP_ORDER",
    "SPLIT_SIZES",
    "TOOL_SPECS",
    "build_messages",
    "dispatch",
    "example_instance",
    "example_messages",
    "format_answer",
    "generate",
    "lenient_parse",
    "lenient_reward",
    "load_instances",
    "parse_final_output",
    "parse_kv",
    "reward",
    "solve",
    "strict_score",
    "system_prompt",
]
