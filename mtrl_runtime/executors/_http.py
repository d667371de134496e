"""The HTTP executor: runs each rollout on a remote agent server.

It posts ``POST {url}/rollout`` in SageMaker AI MTRL's rollout-server shape
(``instance``, ``metadata``, ``inference_params``, ``model_name``,
``model_endpoint``), so one agent server works with both. ``instance`` is
the dataset row (``task_instance``). ``metadata`` carries SageMaker's
``job_arn``, ``trajectory_id``, ``endpoint`` (the coordinator) and
``region``, plus mtrl's ``rollout_id``, ``rollout_token``, ``group_id``,
``max_turns`` and ``timeout_s``. The trajectory id is
``<rollout_id>.<mac>`` (``mtrl_adapters.wire.trajectory_id``, keyed by the
rollout's token): a SageMaker agent echoes it in its trajectory header and
feedback bodies, which binds its SigV4 token (good for the whole run) to
this one rollout. ``model_endpoint`` is the rollout's own OpenAI base URL
under that id, so an agent without mtrl's adapters can use it with the
token (or, in compat mode, a SigV4 token) as its API key. ``HttpExecutor.for_agentcore(url)``
posts the same body to an AgentCore-style runtime (``/invocations``, ``/ping``).

The agent reports its tool calls, reward and end to the coordinator itself.
When the executor is given the coordinator, it also tells it what the server
answered (``ExecutorEnded``) and returns the rollout's final status as the
coordinator decided it, so none stays live.
"""

from __future__ import annotations

from typing import Any, Mapping

import httpx

from mtrl_adapters.wire import rollout_base_url, trajectory_id

from ..types import ExecutorEnded, RolloutCoordinator, RolloutOutcome, RolloutSpec, RolloutStatus, Task

DEFAULT_JOB_ARN = "arn:mtrl:local:job/mtrl"
_FINAL = {s.value: s for s in RolloutStatus if s.is_final} | {"error": RolloutStatus.FAILED}


class HttpExecutor:
    """Runs rollouts on an agent server over HTTP (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        coordinator: RolloutCoordinator | None = None,
        api_key: str | None = None,
        job_arn: str = DEFAULT_JOB_ARN,
        region: str = "local",
        rollout_path: str = "/rollout",
        health_path: str = "/health",
        max_connections: int = 64,
        timeout_margin_s: float = 30.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected the agent server's http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.coordinator = coordinator
        self.job_arn = job_arn
        self.region = region
        self.rollout_path = rollout_path
        self.health_path = health_path
        self.timeout_margin_s = timeout_margin_s
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(None, connect=10.0),
        )

    @classmethod
    def for_agentcore(cls, url: str, **kwargs: Any) -> "HttpExecutor":
        """An executor for an AgentCore-style runtime: ``POST /invocations``, ``GET /ping``."""
        return cls(url, rollout_path="/invocations", health_path="/ping", **kwargs)

    def request_body(self, spec: RolloutSpec) -> dict[str, Any]:
        """The ``POST /rollout`` body for ``spec``."""
        return rollout_request_body(spec, self.job_arn, self.region)

    async def run(self, spec: RolloutSpec) -> RolloutOutcome:
        try:
            response = await self._http.post(
                self.url + self.rollout_path,
                json=self.request_body(spec),
                timeout=httpx.Timeout(spec.timeout_s + self.timeout_margin_s, connect=10.0),
            )
        except httpx.TimeoutException:
            outcome = RolloutOutcome(
                spec.rollout_id, RolloutStatus.TIMED_OUT,
                f"the agent server did not answer within {spec.timeout_s + self.timeout_margin_s:g}s",
            )
        except httpx.HTTPError as exc:
            outcome = RolloutOutcome(
                spec.rollout_id, RolloutStatus.FAILED,
                f"could not reach the agent server at {self.url}: {type(exc).__name__}: {exc}",
            )
        else:
            outcome = _outcome(spec.rollout_id, response)
        return await self._settle(outcome)

    async def health(self) -> dict[str, Any]:
        """The agent server's health answer; raises ``httpx.HTTPStatusError`` when it is not 2xx."""
        response = await self._http.get(self.url + self.health_path, timeout=10.0)
        response.raise_for_status()
        return response.json()

    async def close(self) -> None:
        await self._http.aclose()

    async def _settle(self, outcome: RolloutOutcome) -> RolloutOutcome:
        """Tell the coordinator what the server answered; return the final status it decided."""
        coordinator = self.coordinator
        if coordinator is None:
            return outcome
        rollout_id = outcome.rollout_id
        await coordinator.end(rollout_id, ExecutorEnded(outcome.status, outcome.error))
        recorded = coordinator.recorded(rollout_id, with_turns=False)
        if recorded is None:  # pragma: no cover - the store lost a rollout it committed
            raise RuntimeError(f"rollout {rollout_id!r} is missing from the store")
        return RolloutOutcome(rollout_id, recorded.status, recorded.error)


def rollout_request_body(
    spec: RolloutSpec, job_arn: str = DEFAULT_JOB_ARN, region: str = "local", endpoint: str | None = None
) -> dict[str, Any]:
    """The rollout request an agent server (or an AgentCore runtime) receives for ``spec``.

    ``endpoint``: the coordinator's URL as the agent reaches it; None: ``spec.endpoint``.
    """
    sampling = spec.sampling
    inference_params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
    }
    if sampling.seed is not None:
        inference_params["seed"] = sampling.seed
    endpoint = endpoint or spec.endpoint
    trajectory = trajectory_id(spec.rollout_id, spec.token)
    return {
        "instance": task_instance(spec.task),
        "metadata": {
            "job_arn": job_arn,
            "trajectory_id": trajectory,
            "rollout_id": spec.rollout_id,
            "endpoint": endpoint,
            "region": region,
            "rollout_token": spec.token,
            "group_id": spec.group_id,
            "max_turns": spec.max_turns,
            "timeout_s": spec.timeout_s,
            "policy_models": list(spec.policy_models) if spec.policy_models is not None else None,
        },
        "inference_params": inference_params,
        "model_name": spec.model_name,
        "model_endpoint": rollout_base_url(endpoint, trajectory),
    }


def task_instance(task: Task) -> dict[str, Any]:
    """A task as the request's ``instance``: the dataset row's keys at the top level, as SageMaker sends them.

    A row becomes a Task (``rollouts.task_from_row``) with ``id``, ``prompt``,
    ``messages``, ``ground_truth`` and ``split`` as fields and every other key
    in ``data``; here ``data``'s keys come back to the top level, so an agent
    written for SageMaker AI MTRL reads ``instance["answer"]`` as it would
    there. mtrl's own fields (``id``, ``split``, ``data``, and ``prompt``,
    ``messages``, ``ground_truth`` when set) are kept beside them, and on a
    collision the Task's field wins: those fields were read from the row's
    columns of the same name, so for any row the top level matches the row
    (only a row's own ``data`` column differs: it arrives merged with the
    other columns, as ``Task.data``), and a ``data`` entry that a field hides
    stays readable under ``instance["data"]``. ``AgentTask.from_instance``
    reads both shapes back.
    """
    instance: dict[str, Any] = dict(task.data)
    instance.update({"id": task.id, "split": task.split, "data": dict(task.data)})
    if task.prompt is not None:
        instance["prompt"] = task.prompt
    if task.messages is not None:
        instance["messages"] = [dict(m) for m in task.messages]
    if task.ground_truth is not None:
        instance["ground_truth"] = task.ground_truth
    return instance


def _outcome(rollout_id: str, response: httpx.Response) -> RolloutOutcome:
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    reported = body.get("status") if isinstance(body, Mapping) else None
    if isinstance(reported, str) and reported in _FINAL:
        return RolloutOutcome(rollout_id, _FINAL[reported], body.get("error"))
    if response.is_success:
        return RolloutOutcome(rollout_id, RolloutStatus.COMPLETED)
    text = response.text[:4000]
    return RolloutOutcome(rollout_id, RolloutStatus.FAILED, f"the agent server answered {response.status_code}: {text}")


__all__ = ["DEFAULT_JOB_ARN", "HttpExecutor", "rollout_request_body", "task_instance"]
