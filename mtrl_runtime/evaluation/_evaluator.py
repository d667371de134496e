"""``MultiTurnRLEvaluator``: run an agent over a held-out split and compare fine-tuned with base.

Named as SageMaker AI multi-turn RL's Python SDK names its evaluator, with
its arguments where they mean the same thing here::

    evaluator = MultiTurnRLEvaluator(
        model=trainer,                  # a MultiTurnRLTrainer (its config, agent and adapter), or a model name
        dataset="test.jsonl",           # held-out tasks (JSONL path or rows)
        evaluate_base_model=True,       # also run the base model on the same tasks and seeds
        strict_scorer=strict_score,     # optional: fn(final_text, ground_truth) -> float
        reference=ReferenceModel(url="https://api.example.com/v1", model="frontier-1",
                                 api_key_env="REFERENCE_API_KEY"),  # optional: "what good looks like"
    )
    result = evaluator.evaluate()
    print(result.metrics["val/reward/pass_k_1"], result.report.markdown)

Each model runs ``k`` samples per task (k = max(``pass_k_values``), capped by
``max_samples``) with ``val_sampling_params`` and fixed per-sample seeds.
The fine-tuned adapter is loaded onto the engine. Where the engine can
switch it off per row (``types.MixesBaseRows``: the hf engine with a LoRA
adapter), the fine-tuned and the base side run at once on that engine,
their rows decoding in the same batches, each side with its own
concurrency limit (so the engine holds up to twice the rows, and their KV);
with ``sides_at_once=False``, or on other engines, the fine-tuned side runs
first, then the base model with the adapter disabled for the whole engine
(``base_policy``). Either way each side gets the same tasks and seeds.
A run with roles (``advanced.policy_models`` a mapping, ``roles``) has one
adapter per role, ``<adapter>/<role>/`` (``adapter``: the run folder's by
default): each is loaded by its role's name (``types.LoadsRoleAdapters``),
and each role's calls are served by its own; a role without its folder is
refused naming it. A run folder that holds no role's adapter yet (a config
not trained) evaluates the base model for every role: its rows keep their
roles and are served as base rows (``GenerationRequest.base_model``).
The report (Markdown, JSON, PNG) goes to ``<run_dir>/eval`` (or
``output_path``) and, with ``tracking``, to an MLflow run named ``eval``:
the fine-tuned model's metrics as ``val/...``, the base model's as
``base/val/...``, the report as artifacts, and a trace of every trajectory
the strict scorer disputes.

With ``reference``, the same agent runs the same tasks and seeds a third
time on a reference model behind its own endpoint (OpenAI-compatible,
Anthropic Messages or Bedrock Converse; a frontier model: what good looks
like): the agent's calls still reach the coordinator, which passes them on
(``Coordinator.reference_side``) and records each as a turn named by the
model, without token ids, never trained. Its metrics are ``reference/val/...``. The endpoint is checked
before anything else runs: an unreachable URL or a refused key fails at
once, naming the URL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

from ..config import MtrlConfig
from ..coordinator import ReferenceModel, check_reference
from ..rollouts import HEARTBEAT_S, executor_kind, open_stack, run_to_stop
from ..run_folder import RunFolder
from ..types import LoadsRoleAdapters, MixesBaseRows, Rollout, Task
from ._base_model import base_policy
from ._progress import EvalProgress
from ._report import ReportPaths, report_data, write_report
from ._run import BASE, FINE_TUNED, REFERENCE, EvalPlan, EvalSide, run_side, run_tag, select_tasks
from ._strict import StrictScorer, as_strict_scorer

BASE_PREFIX = "base/"  # MLflow key prefix of the base model's metrics (when a fine-tuned side ran too)
REFERENCE_PREFIX = "reference/"  # MLflow key prefix of the reference model's metrics
MAX_TRACES = 100  # disputed trajectories traced to MLflow per evaluation


@dataclass(frozen=True)
class EvaluationResult:
    """What ``evaluate()`` found: one ``EvalSide`` per model, the plan, and where the report went."""

    sides: Mapping[str, EvalSide]
    plan: EvalPlan
    output_path: Path
    report: ReportPaths | None = None
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fine_tuned(self) -> EvalSide | None:
        return self.sides.get(FINE_TUNED)

    @property
    def base(self) -> EvalSide | None:
        return self.sides.get(BASE)

    @property
    def reference(self) -> EvalSide | None:
        return self.sides.get(REFERENCE)

    @property
    def metrics(self) -> dict[str, float]:
        """Every metric: the evaluated model's as ``val/...`` (fine-tuned when there is one), the base's as
        ``base/val/...`` when both ran, the reference's as ``reference/val/...``."""
        out: dict[str, float] = {}
        for label, side in self.sides.items():
            key_prefix = metric_prefix(label, self.sides)
            out.update({key_prefix + k: v for k, v in side.metrics.items()})
        return out


def metric_prefix(label: str, sides: Mapping[str, Any]) -> str:
    """The MLflow key prefix of side ``label``'s metrics when ``sides`` ran."""
    if label == REFERENCE:
        return REFERENCE_PREFIX
    return BASE_PREFIX if label == BASE and FINE_TUNED in sides else ""


@runtime_checkable
class _Trained(Protocol):
    """What the evaluator reads of a ``MultiTurnRLTrainer`` passed as ``model``."""

    config: MtrlConfig
    agent_env: Any
    engine: Any


class MultiTurnRLEvaluator:
    """Evaluates an agent's policy on held-out tasks (see the module docstring)."""

    def __init__(
        self,
        model: Any = None,
        agent_env: Callable[..., Any] | Any | str | None = None,
        dataset: str | Path | Iterable[Task | Mapping[str, Any]] | None = None,
        output_path: str | Path | None = None,
        config: MtrlConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        adapter: str | Path | None = None,
        evaluate_base_model: bool = False,
        strict_scorer: StrictScorer | Callable[[Any, Any], float] | None = None,
        engine: Any = None,
        split: str | None = None,
        max_tasks: int | None = None,
        max_samples: int | None = None,
        tracking: bool = True,
        reference: ReferenceModel | Mapping[str, Any] | None = None,
        sides_at_once: bool = True,
    ) -> None:
        if model is not None and not isinstance(model, (str, Path)):  # a MultiTurnRLTrainer
            if not isinstance(model, _Trained):
                raise TypeError(f"model: expected a model name or a MultiTurnRLTrainer, got {model!r}")
            config = model.config if config is None else config
            agent_env = model.agent_env if agent_env is None else agent_env
            engine = model.engine if engine is None else engine
            if adapter is None:
                adapter = model.config.run_folder.saved_adapter()
            model = None
        self.config = MtrlConfig.coerce(config)
        if model is not None:
            self.config = self.config.with_overrides({"core.model": str(model)})
        if agent_env is None:
            raise ValueError("agent_env: give the agent to evaluate (a @rollout function, a RolloutExecutor or a URL)")
        executor_kind(agent_env)  # a wrong kind fails here, before any model loads
        if dataset is None:
            raise ValueError("dataset: give held-out tasks (a JSONL path or rows); never evaluate on training prompts")
        self.agent_env = agent_env
        self.dataset = dataset
        self.output_path = Path(output_path) if output_path is not None else self.config.run_folder.evaluation
        self.role_adapters = role_adapter_paths(self.config, adapter)  # None: one policy
        self.adapter = Path(adapter) if adapter is not None and self.role_adapters is None else None
        self.evaluate_base_model = evaluate_base_model
        self.strict_scorer = as_strict_scorer(strict_scorer)
        self.engine = engine
        self.split = split
        self.max_tasks = max_tasks
        self.max_samples = max_samples
        self.tracking = tracking
        self.reference = ReferenceModel.coerce(reference) if reference is not None else None
        self.sides_at_once = sides_at_once  # base and fine-tuned at once where the engine mixes their rows

    def tasks(self) -> list[Task]:
        """The evaluation tasks: the dataset, filtered to ``split`` and cut to ``max_tasks``, in file order."""
        return select_tasks(self.dataset, self.split, self.max_tasks)

    def evaluate(self, progress: bool = False, heartbeat_s: float = HEARTBEAT_S) -> EvaluationResult:
        """Run the evaluation (blocking) and write the report.

        ``progress``: print a start line and, every ``heartbeat_s`` seconds, the rollouts done/total
        (a live status line on a terminal).
        """
        if not progress:
            return run_to_stop(self.aevaluate())
        with EvalProgress(heartbeat_s) as display:
            return run_to_stop(self.aevaluate(display))

    async def aevaluate(self, display: EvalProgress | None = None) -> EvaluationResult:
        """``evaluate()`` for callers already inside an event loop (``display``: an EvalProgress to feed)."""
        plan = EvalPlan.from_config(self.config, self.tasks(), max_samples=self.max_samples)
        reference_key = self.reference.api_key() if self.reference is not None else None
        if self.reference is not None:  # an unreachable reference fails now, before a model loads or a rollout runs
            await check_reference(self.reference, reference_key)
        tag = run_tag()
        # the coordinator's defaults are the plan's too, for agents that do not pass the rollout's sampling on
        config = plan.dispatch_config(self.config)
        async with open_stack(config, self.agent_env, RunFolder(self.output_path).store, self.engine) as stack:
            sides: dict[str, EvalSide] = {}
            dispatcher = stack.dispatcher()  # one tally for the progress lines
            if display is not None:
                display.attach(self._describe(stack, plan), dispatcher.tally, stack.coordinator.counters)
            if self.adapter is not None:
                await stack.engine.load_adapter(str(self.adapter), int(stack.engine.policy_version) + 1)
            if self.role_adapters is not None:
                await load_role_adapters(stack.engine, self.role_adapters)
            fine_tuned = self.adapter is not None or self.role_adapters is not None or stack.engine.policy_version > 0
            at_once = self.sides_at_once and mixes_base_rows(stack.engine)
            if fine_tuned and self.evaluate_base_model and at_once:  # both sides at once
                sides[FINE_TUNED], sides[BASE] = await asyncio.gather(
                    run_side(dispatcher, plan, label=FINE_TUNED, group_prefix=f"eval-{tag}-ft",
                             scorer=self.strict_scorer),
                    run_side(dispatcher, plan, label=BASE, group_prefix=f"eval-{tag}-base",
                             scorer=self.strict_scorer, base_model=True))
            elif fine_tuned:
                sides[FINE_TUNED] = await run_side(dispatcher, plan, label=FINE_TUNED, group_prefix=f"eval-{tag}-ft",
                                                   scorer=self.strict_scorer)
            if BASE not in sides and (self.evaluate_base_model or not sides):
                # roles with no adapter (an untrained run): the rows keep their roles and are the base model's
                untrained_roles = self.config.advanced.role_map is not None and not fine_tuned
                async with base_policy(stack.engine):
                    sides[BASE] = await run_side(dispatcher, plan, label=BASE, group_prefix=f"eval-{tag}-base",
                                                 scorer=self.strict_scorer, base_model=untrained_roles)
            if self.reference is not None:  # the same tasks and seeds, answered by the reference's endpoint
                async with stack.coordinator.reference_side(self.reference, reference_key):
                    sides[REFERENCE] = await run_side(dispatcher, plan, label=REFERENCE, group_prefix=f"eval-{tag}-ref",
                                                      scorer=self.strict_scorer, model=self.reference.model)
            if display is not None:
                display.detach()
        data = report_data(list(sides.values()), plan)
        paths = await asyncio.to_thread(write_report, data, self.output_path / "report")
        result = EvaluationResult(sides, plan, self.output_path, paths, data=data)
        if self.tracking:
            result = await asyncio.to_thread(self._log, result)
        return result

    def _describe(self, stack: Any, plan: EvalPlan) -> dict[str, Any]:
        """The start line's facts: model, engine, where results go, MLflow URI, the work planned."""
        mlflow = (self.config.advanced.mlflow.tracking_uri or self.config.run_folder.mlflow_uri
                  if self.tracking else "off")
        tuned = self.adapter is not None or self.role_adapters is not None
        sides = (2 if self.evaluate_base_model and tuned else 1) + (self.reference is not None)
        reference = f"{self.reference.model} at {self.reference.url}" if self.reference is not None else "none"
        return {
            "evaluating": stack.coordinator.served_model,
            "adapter": self.adapter or (", ".join(f"{r}: {p}" for r, p in self.role_adapters.items())
                                        if self.role_adapters is not None else "none"),
            "reference": reference,
            "engine": stack.coordinator.engine_name,
            "output": self.output_path,
            "MLflow": mlflow,
            "rollouts": f"{len(plan.tasks)} tasks x {plan.samples} samples x {sides} side(s)",
        }

    def _log(self, result: EvaluationResult) -> EvaluationResult:
        from ..tracking import Tracker

        tracker = Tracker(self.config, run_name="eval")
        try:
            log_evaluation(tracker, result)
        except BaseException:
            tracker.close("FAILED")
            raise
        tracker.close("FINISHED")
        return EvaluationResult(result.sides, result.plan, result.output_path, result.report, tracker.run_id,
                                tracker.tracking_uri, result.data)


def role_adapter_paths(config: MtrlConfig, adapter: str | Path | None) -> dict[str, Path] | None:
    """Each role's adapter folder, ``<adapter>/<role>/`` (``adapter``: the run folder's when None), as a run with
    roles saves them; None for a run with one policy, and for a run with roles whose folder holds no role's
    adapter yet (not trained: the base model is evaluated for every role). A folder holding some roles' adapters
    but not all is returned whole: loading it names the missing role."""
    roles = config.advanced.role_map
    if roles is None:
        return None
    root = Path(adapter) if adapter is not None else config.run_folder.adapter
    folders = {role: root / role for role in roles.roles}
    if adapter is None and not any(folder.is_dir() for folder in folders.values()):
        return None  # the run trained no role yet: the base model answers every role's calls
    return folders


async def load_role_adapters(engine: Any, folders: Mapping[str, Path]) -> None:
    """Load each role's adapter onto ``engine`` by the role's name, as the next policy version."""
    if not isinstance(engine, LoadsRoleAdapters):
        raise TypeError(f"advanced.policy_models names roles {sorted(folders)!r}: {type(engine).__name__} cannot "
                        "load an adapter per role (types.LoadsRoleAdapters); use core.engine: hf or vllm")
    await engine.load_role_adapters({role: str(path) for role, path in folders.items()},
                                    int(engine.policy_version) + 1)


def mixes_base_rows(engine: Any) -> bool:
    """Whether ``engine`` serves the base model's rows beside its adapter's now (``types.MixesBaseRows``)."""
    return isinstance(engine, MixesBaseRows) and engine.mixes_base_rows()


def log_evaluation(tracker: Any, result: EvaluationResult, step: int = 0) -> None:
    """Metrics, report artifacts and traces of the disputed trajectories, into ``tracker``'s MLflow run."""
    tracker.log_metrics(step, result.metrics)
    if result.report is not None:
        tracker.log_artifacts(result.report.folder, "evaluation")
    tracker.log_rollouts(disputed_rollouts(result.sides.values())[:MAX_TRACES], step)


def disputed_rollouts(sides: Iterable[EvalSide]) -> list[Rollout]:
    """The rollouts the strict scorer and the reward judge differently, reward-only ones first."""
    out = []
    for side in sides:
        if side.strict is None:
            continue
        by_id = {r.id: r for r in side.rollouts}
        out += [by_id[d.rollout_id] for d in (*side.strict.reward_only, *side.strict.strict_only)]
    return out


__all__ = [
    "BASE",
    "BASE_PREFIX",
    "FINE_TUNED",
    "REFERENCE",
    "REFERENCE_PREFIX",
    "EvaluationResult",
    "MultiTurnRLEvaluator",
    "ReferenceModel",
    "disputed_rollouts",
    "log_evaluation",
    "metric_prefix",
]
