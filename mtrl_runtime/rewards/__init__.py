"""Rewards computed outside the agent: the one signature reward functions read a stored trajectory through.

A reward function that runs outside the agent (``mtrl rescore``, a group
judge, ``mtrl sft``'s filters) is called as ``fn(trajectory)`` with a
``Trajectory``: the task, the conversation as the model last saw it plus its
final reply, the tool calls the adapters recorded, and the final answer. It
returns a number, or ``(number, {metric: value})`` as ``update_reward`` takes.
``score_trajectory`` calls one and checks what it returned.

A group judge (``GroupJudge``, spec ``JudgeSpec``) scores one task's group of
trajectories relative to each other through an OpenAI-compatible endpoint;
``JudgedRewards`` makes its scores a finished training group's rewards. The
judge's names load on first use (httpx), so the config imports ``JudgeSpec``
without them.
"""

from ..lazy import lazy_exports
from ._judge_prompt import JudgeReplyError, judge_messages, labels, parse_scores
from ._judge_spec import DEFAULT_PROMPT_TEMPLATE, DEFAULT_RUBRIC, JudgeSpec, JudgeSpecError
from ._trajectory import RewardFn, Trajectory, last_conversation, score_trajectory, trajectory_of

_LAZY = {
    "GroupJudge": "._judge", "JudgeCall": "._judge", "JudgeError": "._judge", "JudgeVerdict": "._judge",
    "AGENT_REWARD": "._judged", "AGENT_REWARD_DEFAULTED": "._judged", "JUDGED": "._judged",
    "JudgedRewards": "._judged", "judged_rewards": "._judged", "refuse_policy_endpoint": "._judged",
    "TurnJudgedRewards": "._judged",
    "DEFAULT_TURN_TEMPLATE": "._turn_judge", "TurnJudge": "._turn_judge", "TurnView": "._turn_judge",
    "turn_judge_messages": "._turn_judge", "turns_of": "._turn_judge",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "AGENT_REWARD",
    "AGENT_REWARD_DEFAULTED",
    "DEFAULT_PROMPT_TEMPLATE",
    "DEFAULT_RUBRIC",
    "DEFAULT_TURN_TEMPLATE",
    "GroupJudge",
    "JUDGED",
    "JudgeCall",
    "JudgeError",
    "JudgeReplyError",
    "JudgeSpec",
    "JudgeSpecError",
    "JudgeVerdict",
    "JudgedRewards",
    "RewardFn",
    "Trajectory",
    "TurnJudge",
    "TurnJudgedRewards",
    "TurnView",
    "judge_messages",
    "judged_rewards",
    "labels",
    "last_conversation",
    "parse_scores",
    "refuse_policy_endpoint",
    "score_trajectory",
    "trajectory_of",
    "turn_judge_messages",
    "turns_of",
]
