"""Checks to run before training: is the reward fit to train on, is the environment sound?

``check_reward`` (``mtrl check reward``) judges the reward on baseline
rollouts (or audits a group judge on them: ``--judge``); ``check_env``
(``mtrl check env``) runs episodes twice and side by side to find
nondeterministic tools and shared state, and lists the tools.
Both return a ``Checklist`` whose failed items name the first fix.
``check_budget`` (``mtrl check budget``) recommends ``max_turns`` and the
reply cap from collected rollouts and checks the worst case against the
model's context (``BudgetReport``).
"""

from ..budget import BudgetReport, context_budget_warning, recommend
from ._budget import check_budget, check_budget_from_store
from ._checklist import CheckItem, Checklist, Status
from ._env import acheck_env, check_env
from ._judge import JudgedGroup, ajudge_groups, judge_checklist
from ._reward import DEFAULT_MAX_SAMPLES, DEFAULT_MAX_TASKS, acheck_reward, check_reward, reward_checklist
from ._template import TemplateReport, check_template

__all__ = [
    "BudgetReport",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_MAX_TASKS",
    "CheckItem",
    "Checklist",
    "JudgedGroup",
    "Status",
    "TemplateReport",
    "acheck_env",
    "acheck_reward",
    "check_budget",
    "check_budget_from_store",
    "ajudge_groups",
    "check_env",
    "check_reward",
    "check_template",
    "context_budget_warning",
    "judge_checklist",
    "recommend",
    "reward_checklist",
]
