"""``GroupJudge``: scores one task's group of trajectories relative to each other through an OpenAI-compatible endpoint.

Like ART's RULER: the whole group goes to the judge model in one chat
request (``_judge_prompt``), which answers one score in [0, 1] per
trajectory. The request is made with httpx straight from the runtime,
never from inside a rollout, so it cannot reach the policy's capture path
(``judged_rewards`` also refuses a judge URL that is the coordinator's own
endpoint). A transport error, a 429 or a 5xx answer is retried up to
``spec.attempts`` times; any other failure, and a reply that does not score
every trajectory, is an error naming the rollouts: never a default score.

Example::

    judge = GroupJudge("http://127.0.0.1:8000/v1", "judge-model", rubric="Correct answers score 1.")
    verdict = await judge.ajudge([trajectory_of(r, task) for r in group])
    verdict.scores  # one per trajectory, in order; verdict.call: latency and tokens of the request
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

from ..tls import client_tls
from ._judge_prompt import JudgeReplyError, judge_messages, parse_scores
from ._judge_spec import JudgeSpec
from ._trajectory import Trajectory

_RETRIED = frozenset({408, 425, 429, 500, 502, 503, 504})


class JudgeError(RuntimeError):
    """The judge endpoint could not be asked (or refused): names the endpoint, the rollouts and the answer."""


@dataclass(frozen=True)
class JudgeCall:
    """One request to the judge: when, how long, the tokens its endpoint reported (None: not reported)."""

    model: str
    started_at: float
    latency_s: float
    input_tokens: int | None
    output_tokens: int | None
    attempts: int = 1


@dataclass(frozen=True)
class JudgeVerdict:
    """The judge's scores of one group, in the order the trajectories were given."""

    scores: tuple[float, ...]
    explanations: tuple[str, ...]
    call: JudgeCall
    reply: str


class GroupJudge:
    """A group judge over one endpoint and model (see the module docstring).

    ``GroupJudge(base_url, model, api_key=None, rubric=..., prompt_template=...)``
    or ``GroupJudge.from_spec(JudgeSpec.load("judge.yaml"))``; further
    ``JudgeSpec`` fields (``temperature``, ``max_tokens``, ``timeout_s``,
    ``attempts``) as keywords.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, **fields: Any) -> None:
        self.spec = JudgeSpec.of({"base_url": base_url, "model": model, "api_key": api_key, **fields}).resolved()

    @classmethod
    def from_spec(cls, spec: JudgeSpec | Any) -> "GroupJudge":
        judge = cls.__new__(cls)
        judge.spec = JudgeSpec.of(spec).resolved()
        return judge

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def url(self) -> str:
        return f"{self.spec.base_url}/chat/completions"

    async def ajudge(self, trajectories: Sequence[Trajectory]) -> JudgeVerdict:
        """Score ``trajectories`` (one task's group) in one request; JudgeError / JudgeReplyError when it cannot."""
        body = {
            "model": self.spec.model,
            "messages": judge_messages(self.spec, trajectories),
            "temperature": self.spec.temperature,
            "max_tokens": self.spec.max_tokens,
            "stream": False,
        }
        data, call = await self._post(body, trajectories)
        reply = _reply_text(data, self.url, trajectories)
        scores, explanations = parse_scores(reply, trajectories)
        return JudgeVerdict(scores, explanations, call, reply)

    def judge(self, trajectories: Sequence[Trajectory]) -> JudgeVerdict:
        """``ajudge`` for callers outside an event loop."""
        return asyncio.run(self.ajudge(trajectories))

    async def _post(self, body: dict[str, Any], trajectories: Sequence[Trajectory]) -> tuple[Any, JudgeCall]:
        key = self.spec.api_key.get_secret_value() if self.spec.api_key is not None else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        started = time.time()
        clock = time.perf_counter()
        problem = ""
        async with httpx.AsyncClient(timeout=self.spec.timeout_s, verify=client_tls()) as client:
            for attempt in range(1, self.spec.attempts + 1):
                try:
                    response = await client.post(self.url, json=body, headers=headers)
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code == 200:
                        latency = time.perf_counter() - clock
                        data = _json(response, self.url, trajectories)
                        usage = data.get("usage") if isinstance(data, dict) else None
                        usage = usage if isinstance(usage, dict) else {}
                        return data, JudgeCall(self.spec.model, started, latency, _int(usage.get("prompt_tokens")),
                                               _int(usage.get("completion_tokens")), attempt)
                    problem = f"HTTP {response.status_code}: {response.text[:300]!r}"
                    if response.status_code not in _RETRIED:
                        break
                if attempt < self.spec.attempts:
                    await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
        raise JudgeError(f"judge {self.url} (model {self.spec.model!r}) failed for rollouts "
                         f"{', '.join(repr(t.rollout_id) for t in trajectories)} after {attempt} attempt(s): {problem}")


def _json(response: httpx.Response, url: str, trajectories: Sequence[Trajectory]) -> Any:
    try:
        return response.json()
    except ValueError:
        raise JudgeError(f"judge {url} answered 200 with a body that is not JSON for rollouts "
                         f"{', '.join(repr(t.rollout_id) for t in trajectories)}: {response.text[:300]!r}") from None


def _reply_text(data: Any, url: str, trajectories: Sequence[Trajectory]) -> str:
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        content = None
    if not isinstance(content, str):
        raise JudgeReplyError(f"judge {url} answered no message content for rollouts "
                              f"{', '.join(repr(t.rollout_id) for t in trajectories)}: {str(data)[:300]!r}")
    return content


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


__all__ = ["GroupJudge", "JudgeCall", "JudgeError", "JudgeVerdict"]
