"""SQL agent: a plain OpenAI-client agent answers questions by querying its own in-memory SQLite copy.

Data, database, tool, prompts, the dense reward and the strict evaluation;
the agent itself is in ``examples.sql_agent.agent`` (``run`` is its
``@rollout`` entrypoint).
"""

from .data import EXAMPLE_QUESTION, EXAMPLE_SQL, SEED, SPLIT_SIZES, generate, load_instances, stale_files
from .database import build_env, company_env, grading_env, load_rows, schema_sql
from .prompts import build_messages, example_messages, system_prompt
from .reward import execute, format_answer, grade, parse_final_sql, reward, strict_score
from .tools import TOOL_NAME, call_tool, tool_spec

__all__ = [
    "EXAMPLE_QUESTION",
    "EXAMPLE_SQL",
    "SEED",
    "SPLIT_SIZES",
    "TOOL_NAME",
    "build_env",
    "build_messages",
    "call_tool",
    "company_env",
    "example_messages",
    "execute",
    "format_answer",
    "generate",
    "grade",
    "grading_env",
    "load_instances",
    "load_rows",
    "parse_final_sql",
    "reward",
    "schema_sql",
    "stale_files",
    "strict_score",
    "system_prompt",
    "tool_spec",
]
