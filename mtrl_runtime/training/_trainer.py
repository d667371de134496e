"""``MultiTurnRLTrainer``: one object that wires engine, endpoint, store, dispatcher, update and MLflow.

Named as SageMaker AI multi-turn RL's Python SDK names its trainer, with the
same arguments where they mean the same thing here::

    trainer = MultiTurnRLTrainer(
        model="smollm2-135m",
        agent_env=my_agent,             # a @rollout function, a RolloutExecutor, or an agent server URL
        training_dataset="tasks.jsonl",  # or a list of Task / dict rows
        output_path="runs/x",           # the run folder (store, checkpoints, adapter, mlflow.db)
        validation_dataset="val.jsonl",  # optional: validated every core.val_every steps
        strict_scorer=exact_match,      # optional: fn(final_text, ground_truth) -> float
    )
    trainer.hyperparameters.max_steps = 20
    result = trainer.train()
    print(result.output_adapter_path)

``train()`` starts the coordinator on loopback, runs the loop (``_loop``:
validation passes and diagnostics included), saves the final adapter to
``<output_path>/adapter`` and logs it to MLflow. ``resume=True`` continues
from the run folder's latest checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..budget import context_budget_warning
from ..chat import CHAT_TEMPLATE_META
from ..config import RUN_CONFIG_META, ConfigError, CoreConfig, MtrlConfig
from ..coordinator import CoordinatorCounters
from ..engines import resolve_model
from ..evaluation import StrictScorer, as_strict_scorer
from ..monitor import DiagnosticsMonitor, history_from_rows
from ..rewards import judged_rewards
from ..rollouts import HEARTBEAT_S, RolloutStack, TaskSchedule, executor_kind, load_tasks, run_to_stop
from ..torch_support import on_own_thread
from ..tracking import NullTracker, Tracker
from ..types import LoadsRoleAdapters, RolloutExecutor, RunTracker, Task
from ._checkpoint import Checkpoints
from ._init_weights import load_initial_weights
from ._loop import StepReport, TrainingLoop
from ._progress import ProgressDisplay
from ._resume import plan_resume
from ._roles import RoleUpdates
from ._weights import PushedWeights, SharedWeights, WeightSync, shares_model
from .distributed import Ranks, ShardedUpdate, sharded_update_from_config
from .update import Policy, PolicyUpdate, Teacher, UpdateSettings, load_teacher, policy_from_config, preflight_folder

_log = logging.getLogger("mtrl.train")

MLFLOW_RUN_KEY = "mlflow_run_id"


@dataclass(frozen=True)
class TrainingResult:
    """What a finished ``train()`` leaves behind."""

    run_dir: Path
    start_step: int
    final_step: int  # the number of steps trained in total (the next step to train)
    output_adapter_path: Path
    mlflow_run_id: str | None
    tracking_uri: str | None
    reports: tuple[StepReport, ...]


class MultiTurnRLTrainer:
    """Trains the policy behind an agent with multi-turn RL (see the module docstring)."""

    def __init__(
        self,
        model: str | None = None,
        agent_env: Callable[..., Any] | RolloutExecutor | str | None = None,
        training_dataset: str | Path | Iterable[Task | Mapping[str, Any]] | None = None,
        output_path: str | Path | None = None,
        config: MtrlConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        engine: Any = None,
        resume: bool = False,
        tracking: bool = True,
        validation_dataset: str | Path | Iterable[Task | Mapping[str, Any]] | None = None,
        strict_scorer: StrictScorer | Callable[[Any, Any], float] | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        """``ranks``: under torchrun, rank 0's place in the job (``init_ranks()``); the other ranks run
        ``follow_training`` (docs/scaling.md)."""
        self.config = MtrlConfig.coerce(config)
        overrides = {"core.model": model, "core.run_dir": str(output_path) if output_path is not None else None}
        self.config = self.config.with_overrides({k: v for k, v in overrides.items() if v is not None})
        if agent_env is None:
            raise ValueError("agent_env: give the agent to train (a @rollout function, a RolloutExecutor or an agent server URL)")
        self.agent_env = agent_env
        executor_kind(agent_env)  # a wrong kind fails here, before any model loads
        self.training_dataset = training_dataset if training_dataset is not None else self.config.core.dataset
        if self.training_dataset is None:
            raise ValueError("training_dataset: give tasks (a JSONL path or rows), or set core.dataset in the config")
        if strict_scorer is not None and validation_dataset is None:
            raise ValueError("strict_scorer: it scores validation passes; give a validation_dataset too")
        self.validation_dataset = validation_dataset
        self.strict_scorer = as_strict_scorer(strict_scorer)
        self.engine = engine
        self.resume = resume
        self.tracking = tracking
        self.ranks = ranks

    @property
    def hyperparameters(self) -> CoreConfig:
        """The core settings (validated on assignment): ``trainer.hyperparameters.max_steps = 20``."""
        return self.config.core

    def train(
        self,
        progress: bool = True,
        on_step: Callable[[StepReport], bool | None] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> TrainingResult:
        """Train to ``core.max_steps`` (blocking); ``progress`` shows a start line, heartbeats and a line per step.

        ``on_step`` is called after every step; returning True ends the run there (with a checkpoint).
        ``heartbeat_s``: off a terminal, the longest silence during a step.
        """
        if not progress:
            return run_to_stop(self.atrain(on_step))
        with ProgressDisplay(self.config.core.max_steps, heartbeat_s=heartbeat_s) as display:
            def both(report: StepReport) -> bool | None:
                display(report)
                return on_step(report) if on_step is not None else None

            return run_to_stop(self.atrain(both, display))

    async def atrain(
        self, on_step: Callable[[StepReport], bool | None] | None = None, display: ProgressDisplay | None = None
    ) -> TrainingResult:
        """``train()`` for callers already inside an event loop (``display``: a ProgressDisplay to feed)."""
        run = await on_own_thread(_Run.open, self, name="mtrl-build")  # builds the model: torch_support
        try:
            if run.start_step > 0 or run.initialized:  # resumed, or started from init weights: the engine serves them
                await run.weights.publish()
            loop = run.loop(on_step)
            if display is not None:
                display.attach(run.describe(), loop.dispatcher.tally, run.counters, run.start_step)
            try:
                reports = await loop.run(run.start_step)
            finally:
                if display is not None:
                    display.detach()
            adapter = await on_own_thread(run.finish, name="mtrl-save")
        except BaseException:
            await on_own_thread(run.abort, name="mtrl-save")
            raise
        finally:
            await run.close()
        return TrainingResult(
            run_dir=self.config.run_dir,
            start_step=run.start_step,
            final_step=max([run.start_step] + [r.step + 1 for r in reports]),
            output_adapter_path=adapter,
            mlflow_run_id=run.tracker.run_id,
            tracking_uri=run.tracker.tracking_uri,
            reports=tuple(reports),
        )


class _Run:
    """The parts of one ``train()`` call: the rollout stack, the update and its weights strategy, the tracker."""

    def __init__(self) -> None:
        self.stack: RolloutStack | None = None
        self.weights: WeightSync | None = None
        self.tracker: RunTracker = NullTracker()
        self.ranks: Ranks | None = None
        self.update: PolicyUpdate | ShardedUpdate | None = None
        self.initialized = False  # advanced.init_adapter loaded into the policy (a fresh run, not a resume)
        self.budget_warning: str | None = None  # the config's turns cannot fit the model's context

    @classmethod
    def open(cls, trainer: MultiTurnRLTrainer) -> "_Run":
        run = cls()
        try:
            run._build(trainer)
        except BaseException:
            run._close_sync()
            raise
        return run

    def _build(self, trainer: MultiTurnRLTrainer) -> None:
        config = trainer.config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.schedule = TaskSchedule.of(load_tasks(trainer.training_dataset), config.core.train_batch_size, config.core.seed)
        self.validation_tasks = _validation_tasks(trainer.validation_dataset, self.schedule.tasks)
        self.strict_scorer = trainer.strict_scorer
        config.advanced.server.training_mode = True  # the trainer opens the rollouts; POST /v1/rollouts is refused
        self.stack = RolloutStack.build(config, store_path=config.run_folder.store, engine=trainer.engine,
                                        agent_env=trainer.agent_env)
        engine, self.store = self.stack.engine, self.stack.store
        self.budget_warning = context_budget_warning(config.core.max_turns, config.core.sampling_params.max_tokens,
                                                     engine.context_length)
        if self.budget_warning is not None:  # said at start (and on the start line): training may still be wanted
            _log.warning("mtrl: %s", self.budget_warning)
        self.store.set_meta(RUN_CONFIG_META, config.recorded())  # what it ran with: mtrl rescore reads it
        # a group judge's scores become the training groups' rewards; one at the policy's own endpoint is refused
        self.judge = judged_rewards(config.advanced.group_judge, self.store, self.stack.endpoint)
        settings = UpdateSettings.from_config(config)
        self.ranks = trainer.ranks
        if config.advanced.distill_teacher is not None and self.ranks is not None:
            raise ConfigError(f"advanced.distill_teacher: {config.advanced.distill_teacher!r}: distillation under "
                              "torchrun is not supported yet; run mtrl train on one process")
        if shares_model(engine) and self.ranks is None:
            policy = policy_from_config(config, engine.model, engine.tokenizer)
            roles = config.advanced.role_map
            if roles is None:
                self.update = PolicyUpdate(policy, settings, weights_lock=engine.weights_lock,
                                           teacher=_teacher(config, policy))
            else:  # one adapter per role on the engine's model: it serves each role's rows with its own
                self.update = RoleUpdates(policy, roles.roles, settings, engine.weights_lock, seed=config.core.seed)
            self.update.check_fits()  # before the first rollout: a step that cannot fit fails here, with the numbers
            self.weights = SharedWeights(engine, self.update,
                                         partial_rollouts=config.advanced.async_config.partial_rollouts)
        else:
            roles = config.advanced.role_map
            if roles is not None and (self.ranks is not None or not isinstance(engine, LoadsRoleAdapters)):
                raise ConfigError(
                    f"advanced.policy_models: roles {list(roles.roles)!r} train one adapter each; "
                    f"{type(engine).__name__} neither shares its model with the trainer nor loads an adapter per role"
                    + (" (and training runs under torchrun)" if self.ranks is not None else "")
                    + ". Use core.engine: hf or vllm, on one process")
            if config.advanced.full_finetune:  # the config refuses engine: vllm; this catches an engine object given
                raise ConfigError(
                    f"advanced.full_finetune: true needs an engine that serves the trainer's own model (hf); "
                    f"{type(engine).__name__} receives each new policy version as a LoRA adapter folder")
            folder = resolve_model(config.core.model)
            preflight_folder(config, folder, world_size=1 if self.ranks is None else self.ranks.world_size)
            if roles is not None:  # the engine loads each role's adapter by name after every update (vllm)
                self.update = RoleUpdates(policy_from_config(config, folder), roles.roles, settings,
                                          seed=config.core.seed)
            elif self.ranks is None:
                policy = policy_from_config(config, folder)
                self.update = PolicyUpdate(policy, settings, teacher=_teacher(config, policy))
            else:  # every rank holds a shard, only this one reads the weights; it leads each step and save
                self.update = sharded_update_from_config(config, folder, self.ranks)
            self.update.check_fits()
            # the engine reloads its kept versions from these folders after a restart: keep as many
            keep = max(2, int(config.advanced.engine_options.get("keep_versions", 2)))
            self.weights = PushedWeights(engine, self.update, config.run_dir, keep=keep)
        self.checkpoints = Checkpoints(config.run_dir, self.store, keep=config.advanced.keep_checkpoints)
        self.start_step, self.plan = self._restore(trainer.resume)
        self.initialized = self._initial_weights()
        self.tracker = self._tracker(trainer.tracking)
        self.monitor = DiagnosticsMonitor.for_config(config, tracker=self.tracker, echo=None)
        if self.start_step > 0:  # resumed: the rules read the whole run, and what was said stays said
            self.monitor.preload(history_from_rows(self.store.metric_history()))

    def _initial_weights(self) -> bool:
        """Load ``advanced.init_adapter`` into a fresh run's policy (a resume restores its checkpoint instead)."""
        folder = self.config.advanced.init_adapter
        if folder is None or self.start_step > 0:
            return False
        if self.ranks is not None:
            raise ConfigError("advanced.init_adapter: starting from trained weights under torchrun is not supported "
                              "yet; run mtrl train on one process, or leave init_adapter out")
        load_initial_weights(self.update.policy, folder)
        return True

    def _restore(self, resume: bool) -> tuple[int, Any]:
        latest = self.checkpoints.latest()
        if not resume:
            if latest is not None:
                raise FileExistsError(
                    f"run_dir {str(self.config.run_dir)!r} already holds a run (checkpoint {latest.name}); "
                    "resume it (resume=True, mtrl train --resume) or choose another run_dir"
                )
            return 0, None
        if latest is None:
            raise FileNotFoundError(f"resume: no checkpoint under {self.checkpoints.folder}; start without resume")
        state = self.checkpoints.restore(self.update)
        return state.next_step, plan_resume(self.store, state.next_step, int(self.update.version))

    def _tracker(self, enabled: bool) -> RunTracker:
        if not enabled:
            return NullTracker()
        rendered = self.store.get_meta(CHAT_TEMPLATE_META) or {}  # the endpoint's chat format, written at its start
        tracker = Tracker(self.config, run_id=self.store.get_meta(MLFLOW_RUN_KEY), chat_format=rendered.get("chat_format"))
        self.store.set_meta(MLFLOW_RUN_KEY, tracker.run_id)
        return tracker

    def loop(self, on_step: Callable[[StepReport], bool | None] | None) -> TrainingLoop:
        assert self.stack is not None
        return TrainingLoop(
            config=self.config,
            schedule=self.schedule,
            dispatcher=self.stack.dispatcher(group_scorer=self.judge),
            weights=self.weights,
            checkpoints=self.checkpoints,
            tracker=self.tracker,
            resume=self.plan,
            on_step=on_step,
            validation_tasks=self.validation_tasks,
            strict_scorer=self.strict_scorer,
            monitor=self.monitor,
        )

    @property
    def counters(self) -> CoordinatorCounters:
        assert self.stack is not None
        return self.stack.coordinator.counters

    def describe(self) -> dict[str, Any]:
        """The start line's facts: model, engine, run folder, MLflow URI, first step."""
        assert self.stack is not None
        return {
            "training": self.stack.coordinator.served_model,
            "engine": self.stack.coordinator.engine_name,
            "run folder": self.config.run_dir,
            "MLflow": self.tracker.tracking_uri or "off",
            "from step": f"{self.start_step + 1} of {self.config.core.max_steps}",
            **({"starting from": self.config.advanced.init_adapter} if self.initialized else {}),
            **({"WARNING": self.budget_warning} if self.budget_warning else {}),
        }

    def finish(self) -> Path:
        """Save the final adapter (or model), log it to MLflow, end the MLflow run."""
        adapter = self.update.policy.save_weights(self.config.run_folder.adapter)
        self.tracker.log_artifacts(adapter, "adapter")
        self.tracker.close("FINISHED")
        return adapter

    def abort(self) -> None:
        self.tracker.close("FAILED")

    async def close(self) -> None:
        if self.weights is not None:
            await asyncio.to_thread(self.weights.close)
            self.weights = None
        if isinstance(self.update, ShardedUpdate):  # release the other ranks from follow_training, and leave the job
            self.update.stop(leave=True)
            self.update = None
        if self.stack is not None:
            await self.stack.close()
            self.stack = None

    def _close_sync(self) -> None:
        """Close from a thread with no running loop (a failed build)."""
        asyncio.run(self.close())


def _teacher(config: MtrlConfig, policy: Policy) -> Teacher | None:
    """The distill loss's teacher (``advanced.distill_teacher``), loaded beside ``policy`` before the first rollout."""
    folder = config.advanced.distill_teacher
    if folder is None:
        return None
    frozen = next((p.dtype for p in policy.model.parameters() if not p.requires_grad), None)
    is_adapter = (Path(folder) / "adapter_config.json").is_file()  # only an adapter needs core.model's folder
    try:
        return load_teacher(folder, resolve_model(config.core.model) if is_adapter else None, policy.tokenizer,
                            policy.device, frozen or next(policy.model.parameters()).dtype)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _validation_tasks(source: Any, training: Sequence[Task]) -> tuple[Task, ...]:
    """The validation tasks; an id naming a different training task is refused (the store keys tasks by id)."""
    if source is None:
        return ()
    tasks = tuple(load_tasks(source))
    by_id = {t.id: t for t in training}
    for task in tasks:
        if task.id in by_id and by_id[task.id] != task:
            raise ValueError(f"validation_dataset: task id {task.id!r} names a different training task; "
                             "give validation tasks their own ids")
    return tasks


__all__ = ["MultiTurnRLTrainer", "TrainingResult"]
