"""The mtrl coordinator: policy endpoint, engines, trajectory store, rollouts, trainer, evaluator.

The public door. Everything a user reaches for is importable from here::

    from mtrl_runtime import MtrlConfig, MultiTurnRLTrainer, MultiTurnRLEvaluator, Task

Names load on first use (PEP 562), so ``import mtrl_runtime`` stays light:
it imports neither torch nor transformers until a name that needs them is used.
"""

from __future__ import annotations

from .lazy import lazy_exports

# public name -> the module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    # the contract
    "Task": ".types",
    "Turn": ".types",
    "ToolCall": ".types",
    "Rollout": ".types",
    "RolloutStatus": ".types",
    "Sample": ".types",
    "SamplingParams": ".types",
    "GenerationRequest": ".types",
    "Generation": ".types",
    "RolloutSpec": ".types",
    "RolloutOutcome": ".types",
    "RolloutHandle": ".types",
    "PolicyEngine": ".types",
    "SharedModelEngine": ".types",
    "RolloutExecutor": ".types",
    "RolloutCoordinator": ".types",
    "TrajectoryStore": ".types",
    # configuration
    "MtrlConfig": ".config",
    "ConfigError": ".config",
    # training and evaluation
    "MultiTurnRLTrainer": ".training",
    "TrainingResult": ".training",
    "MultiTurnRLEvaluator": ".evaluation",
    "EvaluationResult": ".evaluation",
    "StrictScorer": ".evaluation",
    "check_reward": ".checks",
    "check_env": ".checks",
    # collecting rollouts
    "RolloutStack": ".rollouts",
    "open_stack": ".rollouts",
    "Dispatcher": ".rollouts",
    "load_tasks": ".rollouts",
    "executor_for": ".rollouts",
    "InProcessExecutor": ".executors",
    "HttpExecutor": ".executors",
    "RayExecutor": ".executors",
    "AgentCoreExecutor": ".executors",
    # parts
    "Coordinator": ".coordinator",
    "create_app": ".server",
    "start_server": ".server",
    "create_engine": ".engines",
    "resolve_model": ".engines",
    "ScriptedEngine": ".engines",
    "open_store": ".store",
    "SQLiteStore": ".store",
    "export_adapter": ".export",
    "export_merged": ".export",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
