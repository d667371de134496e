"""Coding: an OpenAI-client agent fixes a bug in a small repository, its tools running in the rollout's sandbox.

Tasks, tools, prompts and the strict scorer; the agent itself is in
``examples.coding.agent`` (``run`` is its ``@rollout`` entrypoint).
"""

from .data import SEED, SPLIT_SIZES, generate, load_instances, stale_files
from .prompts import SYSTEM_PROMPT, build_messages
from .reward import Score, score
from .templates import TEMPLATES
from .tools import TOOL_NAMES, TOOLS, call_tool

__all__ = [
    "SEED",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "TEMPLATES",
    "TOOLS",
    "TOOL_NAMES",
    "Score",
    "build_messages",
    "call_tool",
    "generate",
    "load_instances",
    "score",
    "stale_files",
]
