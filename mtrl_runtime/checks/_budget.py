"""``mtrl check budget``: collect rollouts (or read a run's) and report their turn and token budget.

The figures and rules are ``mtrl_runtime.budget``'s (``recommend``); this
module runs baseline rollouts as training samples them, or reads an
existing run's store, and finds the model's context window (the engine's,
else the model's ``config.json``, else the one given). The report prints
the table and the YAML lines to paste; the exit status of the command is 1
when the current config cannot fit the context.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from ..budget import BudgetReport, recommend
from ..config import MtrlConfig
from ..evaluation import EvalPlan, run_side, run_tag, select_tasks
from ..rollouts import open_stack

def context_window(model: str) -> int | None:
    """The model's context window from its config.json (``max_position_embeddings`` and the like), else None."""
    from ..engines import resolve_model

    path = Path(resolve_model(model)) / "config.json"
    config = json.loads(path.read_text())
    for section in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(section.get(key), int):
                return int(section[key])
    return None


def _context(engine_context: int | None, model: str, given: int | None) -> tuple[int | None, str]:
    if given is not None:
        if given < 1:
            raise ValueError(f"context_length: must be >= 1 tokens, got {given}")
        return given, "given"
    if engine_context is not None:
        return int(engine_context), "the engine"
    window = context_window(model)
    return window, f"{model}'s config.json" if window is not None else "not known"


async def acheck_budget(
    agent_env: Any,
    dataset: Any,
    config: Any = None,
    *,
    engine: Any = None,
    max_tasks: int = 16,
    samples: int | None = None,
    split: str | None = None,
    output_path: str | Path | None = None,
    context_length: int | None = None,
) -> BudgetReport:
    """Run ``max_tasks`` x ``samples`` rollouts as training samples them and report their budget."""
    cfg = MtrlConfig.coerce(config)
    tasks = select_tasks(dataset, split, max_tasks)
    k = samples if samples is not None else min(cfg.core.group_size, 8)
    plan = EvalPlan.from_config(cfg, tasks, samples=k, sampling=cfg.core.sampling_params)
    folder = Path(output_path) if output_path is not None else cfg.run_folder.checks
    async with open_stack(cfg, agent_env, folder / "check_budget.db", engine) as stack:
        side = await run_side(stack.dispatcher(), plan, label="baseline", group_prefix=f"check-budget-{run_tag()}")
        window, source = _context(stack.engine.context_length, cfg.core.model, context_length)
    return recommend(side.rollouts, max_turns=cfg.core.max_turns, max_tokens=cfg.core.sampling_params.max_tokens,
                     context_length=window, context_source=source, success_threshold=plan.success_threshold)


def check_budget(*args: Any, **kwargs: Any) -> BudgetReport:
    """``acheck_budget`` for callers outside an event loop (same arguments)."""
    return asyncio.run(acheck_budget(*args, **kwargs))


def check_budget_from_store(store_path: str | Path, config: Any = None, *,
                            context_length: int | None = None) -> BudgetReport:
    """The budget of the rollouts an existing run recorded at ``store_path`` (its config: the budget they ran under)."""
    from ..store import open_store

    cfg = MtrlConfig.coerce(config)
    if not Path(store_path).is_file():
        raise FileNotFoundError(f"store: no trajectory store at {str(store_path)!r}")
    store = open_store(store_path)
    try:
        rollouts = [r for r in store.rollouts() if r.turns]
    finally:
        store.close()
    window, source = _context(None, cfg.core.model, context_length)
    return recommend(rollouts, max_turns=cfg.core.max_turns, max_tokens=cfg.core.sampling_params.max_tokens,
                     context_length=window, context_source=source, success_threshold=cfg.core.success_threshold)


__all__ = ["acheck_budget", "check_budget", "check_budget_from_store", "context_window"]
