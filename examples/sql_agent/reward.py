"""Reward and strict evaluation for the SQL task: run the agent's final query, compare result sets.

The agent answers with its final query inside ``<final_output>...</final_output>``
(the SQL itself, no JSON around it). Both queries run on a fresh copy of
the database (read-only, with a timeout), and the rows are compared with
``result_sets_equal``: column names are ignored, duplicates count, order
counts only where the question asks for one.

``reward`` is dense: 0.1 for a well-formed answer block + 0.2 when the
query executes without error + 0.7 when its rows equal the gold query's.
It is lenient about the wrapper on purpose: without a well-formed block it
grades the first SELECT / WITH statement of the reply (and withholds the
0.1), so a small model that already writes SQL, but not yet the tags, gets
a signal to learn from. ``strict_score`` is not lenient: 1 only for one
well-formed block whose query matches exactly. So the two agree on 1 and
on 0, and differ exactly on partial answers.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from mtrl_runtime.envs import SqliteEnv, result_sets_equal

from .database import grading_env

FORMAT_WEIGHT = 0.1
EXECUTES_WEIGHT = 0.2
MATCH_WEIGHT = 0.7

_OPEN, _CLOSE = "<final_output>", "</final_output>"


def parse_final_sql(text: Any) -> str | None:
    """The query inside exactly one ``<final_output>`` block, or None (no block, two blocks, empty)."""
    if not isinstance(text, str) or text.count(_OPEN) != 1 or text.count(_CLOSE) != 1:
        return None
    start, end = text.index(_OPEN) + len(_OPEN), text.index(_CLOSE)
    if end < start:
        return None
    sql = text[start:end].strip()
    return sql or None


# A bare statement in free text: from SELECT/WITH to a semicolon, a tag like <x> or </x>, a code fence or the end.
_BARE_SQL = re.compile(r"\b(?:SELECT|WITH)\b.*?(?=;|</?[A-Za-z_]+>|```|$)", re.IGNORECASE | re.DOTALL)


def find_sql(text: Any) -> str | None:
    """The query to grade: the well-formed block's, else the first bare SELECT / WITH statement, else None."""
    strict = parse_final_sql(text)
    if strict is not None or not isinstance(text, str):
        return strict
    found = _BARE_SQL.search(text)
    return found.group(0).strip() if found else None


def _check_ground_truth(ground_truth: Any) -> None:
    if not isinstance(ground_truth, Mapping) or not isinstance(ground_truth.get("sql"), str):
        raise ValueError(f"ground_truth must be a mapping with a 'sql' string, got {ground_truth!r}")


def execute(sql: str, env: SqliteEnv | None = None) -> dict[str, Any]:
    """Run one read-only query on a fresh copy of the database: ``{"rows": ...}`` or ``{"error": ...}``."""
    with (env or grading_env()).open() as db:
        result = db.query(sql)
        if result.get("truncated"):  # a partial result cannot be compared
            return {"error": f"the result has more than {db.row_limit} rows"}
    return result


def grade(text: str, ground_truth: Mapping[str, Any], env: SqliteEnv | None = None) -> dict[str, bool]:
    """The three checks: ``format_ok``, ``executes``, ``match``."""
    _check_ground_truth(ground_truth)
    sql = find_sql(text)
    well_formed = parse_final_sql(text) is not None
    if sql is None:
        return {"format_ok": False, "executes": False, "match": False}
    gold = execute(ground_truth["sql"], env)
    if "error" in gold:
        raise ValueError(f"the gold query fails: {ground_truth['sql']!r}: {gold['error']}")
    got = execute(sql, env)
    executes = "error" not in got
    match = executes and result_sets_equal(got, gold, ordered=bool(ground_truth.get("ordered", False)))
    return {"format_ok": well_formed, "executes": executes, "match": match}


def reward(text: str, ground_truth: Mapping[str, Any],
           env: SqliteEnv | None = None) -> tuple[float, dict[str, float]]:
    """Dense reward for the final message; metrics ``format_ok``, ``executes``, ``match``, ``strict``, ``completion``."""
    passed = grade(text, ground_truth, env)
    metrics = {name: float(ok) for name, ok in passed.items()}
    metrics["strict"] = float(passed["format_ok"] and passed["match"])
    metrics["completion"] = metrics["format_ok"]
    score = (FORMAT_WEIGHT * passed["format_ok"] + EXECUTES_WEIGHT * passed["executes"]
             + MATCH_WEIGHT * passed["match"])
    return score, metrics


def strict_score(text: str, ground_truth: Mapping[str, Any], env: SqliteEnv | None = None) -> float:
    """1.0 when one well-formed block's query returns exactly the gold rows (order where it matters), else 0.0."""
    passed = grade(text, ground_truth, env)
    return float(passed["format_ok"] and passed["match"])


def format_answer(sql: str) -> str:
    """The canonical final message for a query."""
    return f"{_OPEN}{sql}{_CLOSE}"


__all__ = ["EXECUTES_WEIGHT", "FORMAT_WEIGHT", "MATCH_WEIGHT", "execute", "find_sql", "format_answer", "grade",
           "parse_final_sql", "reward", "strict_score"]
