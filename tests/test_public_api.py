"""The public door: ``mtrl_runtime`` exports exactly the user-facing names, lazily."""

from __future__ import annotations

import subprocess
import sys

import mtrl_runtime

EXPECTED = {
    "Task", "Turn", "ToolCall", "Rollout", "RolloutStatus", "Sample", "SamplingParams",
    "GenerationRequest", "Generation", "RolloutSpec", "RolloutOutcome", "RolloutHandle",
    "PolicyEngine", "SharedModelEngine", "RolloutExecutor", "RolloutCoordinator", "TrajectoryStore",
    "MtrlConfig", "ConfigError",
    "MultiTurnRLTrainer", "TrainingResult", "MultiTurnRLEvaluator", "EvaluationResult", "StrictScorer",
    "check_reward", "check_env",
    "RolloutStack", "open_stack", "Dispatcher", "load_tasks", "executor_for",
    "InProcessExecutor", "HttpExecutor", "RayExecutor", "AgentCoreExecutor",
    "Coordinator", "create_app", "start_server", "create_engine", "resolve_model", "ScriptedEngine",
    "open_store", "SQLiteStore", "export_adapter", "export_merged",
}


def test_the_exported_names_are_the_user_facing_ones():
    assert set(mtrl_runtime.__all__) == EXPECTED


def test_every_exported_name_resolves_to_the_object_its_module_defines():
    import importlib

    for name in mtrl_runtime.__all__:
        value = getattr(mtrl_runtime, name)
        module = importlib.import_module(mtrl_runtime._EXPORTS[name], "mtrl_runtime")
        assert value is getattr(module, name), name


def test_an_unknown_name_is_an_attribute_error_naming_it():
    try:
        mtrl_runtime.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an unknown name resolved")


def test_importing_the_package_and_the_contract_stays_light():
    code = (
        "import sys, mtrl_runtime\n"
        "from mtrl_runtime import Task, MtrlConfig\n"
        "heavy = [m for m in ('torch', 'transformers', 'fastapi', 'mlflow') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing mtrl_runtime pulled in {out}"
