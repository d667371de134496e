"""The recipes and the aircraft inspection example's config: they load, keep their promises, and train one step.

``recipes/cpu-small.yaml`` must equal the demo's ``DEMO_RECIPE`` and the
aircraft config must hold the same values (they are the same recipe); the GPU
recipes must keep DESIGN.md's defaults and give the vllm engine only options
it takes. The aircraft config then trains one real step: the Strands agent
against the coordinator, a scripted policy that follows the SOP in one
rollout per aircraft and answers wrongly in the others, and the tiny Llama
as the trained policy (so the group has a reward spread and the LoRA moves).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_runtime.cli.demo import DEMO_RECIPE
from mtrl_runtime.config import MtrlConfig

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
GPU_RECIPES = [path for path in RECIPES if path.name != "cpu-small.yaml"]
# each recipe's model (a hub id) and the chat format its family writes (mtrl_runtime/chat/formats)
# the models that write reasoning before they answer (SmolLM2 and Llama 3.1 do not)
THINKING = {"gpt-oss-20b.yaml", "qwen3-0.6b.yaml", "qwen3-1.7b.yaml", "qwen3-4b.yaml", "qwen3-8b.yaml"}
MODELS = {
    "cpu-small.yaml": ("smollm2-135m", "hermes"),
    "gpt-oss-20b.yaml": ("openai/gpt-oss-20b", "harmony"),
    "llama-3.1-8b.yaml": ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json"),
    "qwen2.5-coder-7b.yaml": ("Qwen/Qwen2.5-Coder-7B-Instruct", "hermes"),
    "qwen3-0.6b.yaml": ("Qwen/Qwen3-0.6B", "hermes"),
    "qwen3-1.7b.yaml": ("Qwen/Qwen3-1.7B", "hermes"),
    "qwen3-4b.yaml": ("Qwen/Qwen3-4B", "hermes"),
    "qwen3-8b.yaml": ("Qwen/Qwen3-8B", "hermes"),
}
AIRCRAFT_CONFIG = REPO / "examples" / "aircraft_inspection" / "config.yaml"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def test_the_recipes_folder_holds_the_cpu_recipe_four_qwen3_sizes_gpt_oss_llama_and_a_coder():
    assert [p.name for p in RECIPES] == [
        "cpu-small.yaml", "gpt-oss-20b.yaml", "llama-3.1-8b.yaml", "qwen2.5-coder-7b.yaml", "qwen3-0.6b.yaml",
        "qwen3-1.7b.yaml", "qwen3-4b.yaml", "qwen3-8b.yaml",
    ]


@pytest.mark.parametrize("path", RECIPES + [AIRCRAFT_CONFIG], ids=lambda p: p.parent.name + "/" + p.name)
def test_every_recipe_names_its_model_family_chat_format(path):
    """A recipe names its format rather than leaving it to detection (Qwen3-Coder has ChatML's tokens too)."""
    config = MtrlConfig.from_yaml(path)
    model, chat_format = MODELS[path.name if path != AIRCRAFT_CONFIG else "cpu-small.yaml"]
    assert (config.core.model, config.advanced.chat_format) == (model, chat_format)
    # a thinking model whose template drops earlier reasoning trains each turn as deployment renders it;
    # a model that writes no reasoning keeps the one extended sequence (no drift: bench/template_drift.py)
    from mtrl_runtime.chat.formats import CHAT_FORMATS, ReasoningHistory

    drops = CHAT_FORMATS.get(chat_format).reasoning_history is ReasoningHistory.DROPPED
    name = path.name if path != AIRCRAFT_CONFIG else "cpu-small.yaml"
    expected = "deployed" if drops and name in THINKING else "extend"
    assert config.advanced.history_training == expected


@pytest.mark.parametrize("path", RECIPES + [AIRCRAFT_CONFIG], ids=lambda p: p.parent.name + "/" + p.name)
def test_every_recipe_loads_and_validates(path):
    config = MtrlConfig.from_yaml(path)
    assert config.core.model and config.core.engine in ("hf", "vllm")
    assert config.core.lora_alpha == 2 * config.core.lora_rank


def test_cpu_small_is_the_demo_recipe_key_for_key():
    assert yaml.safe_load((REPO / "recipes" / "cpu-small.yaml").read_text()) == DEMO_RECIPE
    assert MtrlConfig.from_yaml(REPO / "recipes" / "cpu-small.yaml") == MtrlConfig.from_dict(DEMO_RECIPE)


def test_the_aircraft_config_is_the_demo_recipe_with_its_own_run_dir_and_dataset():
    data = yaml.safe_load(AIRCRAFT_CONFIG.read_text())
    core = dict(data["core"])
    assert core.pop("run_dir") == "runs/aircraft_inspection"
    assert (REPO / core.pop("dataset")).resolve() == (AIRCRAFT_CONFIG.parent / "instances" / "train.jsonl").resolve()
    demo_core = {k: v for k, v in DEMO_RECIPE["core"].items() if k != "run_dir"}
    assert core == demo_core and data["advanced"] == DEMO_RECIPE["advanced"]


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.name)
def test_gpu_recipes_keep_the_design_defaults_and_size_vllm_for_one_gpu(path):
    config = MtrlConfig.from_yaml(path)
    core, advanced = config.core, config.advanced
    assert core.model == MODELS[path.name][0]  # a hub id, e.g. Qwen/Qwen3-4B
    assert core.run_dir == f"runs/{path.stem}" and core.dataset is None  # --dataset names the user's tasks
    assert (core.engine, advanced.precision, advanced.engine_options["dtype"]) == ("vllm", "bf16", "bfloat16")
    assert (core.group_size, core.train_batch_size, core.max_steps, core.val_every) == (8, 128, 50, 10)
    assert (core.learning_rate, core.lora_rank, core.lora_alpha) == (4e-5, 32, 64)
    assert (core.advantage_method, core.loss_fn) == ("group_based", "ppo")
    assert core.sampling_params.max_tokens == core.val_sampling_params.max_tokens == 4096
    assert core.pass_k_values == [1, 2, 4, 8, 16, 32] and core.success_threshold == 1.0
    options = advanced.engine_options
    assert options["max_lora_rank"] >= core.lora_rank and options["max_lora_rank"] in VLLM_LORA_RANKS
    assert options["max_model_len"] >= core.max_turns * core.sampling_params.max_tokens
    args = options["server_args"]
    utilization = float(args[args.index("--gpu-memory-utilization") + 1])
    assert 0.2 <= utilization <= 0.5, "vLLM must leave the trainer room on the same GPU"
    assert 16 <= advanced.max_concurrency <= 128


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.name)
def test_gpu_recipes_give_the_vllm_engine_only_options_it_takes(path):
    from mtrl_runtime.engines import VLLMEngine
    from mtrl_runtime.engines.vllm._server import VLLMServer

    known = set(inspect.signature(VLLMEngine).parameters) | set(inspect.signature(VLLMServer).parameters)
    options = MtrlConfig.from_yaml(path).advanced.engine_options
    assert set(options) <= known - {"model", "python", "url", "kwargs"}, set(options) - known


def test_the_recipes_readme_lists_every_recipe():
    readme = (REPO / "recipes" / "README.md").read_text()
    for path in RECIPES:
        assert f"`{path.name}`" in readme
    assert "does not download" in readme or "never downloads" in readme


# --------------------------------------------------------------------------- the aircraft example, one step

_REQUEST = re.compile(r"Inspect aircraft (N[0-9A-Z]+)")
WRONG = {"aircraft_valid": False, "maintenance_due": True, "mechanical_status": "fail",
         "electrical_status": "fail", "incident_flag": True, "decision": "ground"}  # every check failing


def _sop_policy(rows: list[dict]) -> Any:
    """The reference solver's replies for the first rollout of each aircraft; the others answer at once, wrongly."""
    from examples.aircraft_inspection import format_answer, solve
    from mtrl_runtime.engines import ScriptedReply

    first: dict[str, str] = {}

    def policy(request: Any, prompt: str) -> Any:
        tail = _REQUEST.findall(prompt)[-1]  # the last request: the worked example's comes first
        if first.setdefault(tail, request.rollout_id) != request.rollout_id:
            return format_answer(WRONG)
        episode = solve({"id": tail, "data": {"tail_number": tail}})
        calls = [m for m in episode.messages if m["role"] == "assistant" and m.get("tool_calls")]
        if request.turn_index < len(calls):
            fn = calls[request.turn_index]["tool_calls"][0]["function"]
            return ScriptedReply.tool_call(fn["name"], json.loads(fn["arguments"]))
        return format_answer(episode.answer)

    return policy


@pytest.mark.timeout(240)
def test_the_aircraft_config_trains_one_step_of_the_strands_agent(tmp_path, tiny_tok, tiny_model_dir):
    import torch

    from examples.aircraft_inspection import load_instances
    from examples.aircraft_inspection.agent import run
    from mtrl_runtime.cli import load_agent
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.training import MultiTurnRLTrainer

    pytest.importorskip("strands")
    torch.set_num_threads(1)
    assert load_agent("examples.aircraft_inspection.agent:run") is run  # what `mtrl train --agent` names
    rows = [r for r in load_instances("train") if r["ground_truth"]["aircraft_valid"]][:2]  # WRONG misses a field
    config = MtrlConfig.from_yaml(AIRCRAFT_CONFIG).with_overrides({
        "core.model": str(tiny_model_dir), "core.run_dir": str(tmp_path / "run"), "core.group_size": 2,
        "core.max_steps": 1, "core.lora_rank": 4, "core.lora_alpha": 8, "core.learning_rate": 1e-3,
        "core.sampling_params.max_tokens": 256, "advanced.checkpoint_every": 0, "advanced.rollout_timeout_s": 60,
    })
    engine = ScriptedEngine(tiny_tok, _sop_policy(rows))
    trainer = MultiTurnRLTrainer(agent_env=run, training_dataset=rows, engine=engine, config=config, tracking=False)
    result = trainer.train(progress=False)
    metrics = result.reports[0].metrics
    assert metrics["rollout/count"] == 4 and metrics["rollout/completed_frac"] == 1.0
    assert metrics["rollout/reward/max"] == 1.0 and metrics["rollout/reward/min"] < 1.0
    assert metrics["rollout/metrics/strict"] == 0.5  # one rollout per aircraft follows the SOP
    assert metrics.get("train/skipped", 0.0) == 0.0 and metrics["analysis/zero_adv_groups"] == 0.0
    assert _lora_b_norm(result.output_adapter_path) > 0  # LoRA starts with B = 0: the step moved the policy


def _lora_b_norm(adapter: Path) -> float:
    from safetensors.torch import load_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    return sum(float(t.norm()) for name, t in tensors.items() if "lora_B" in name)


def test_the_demo_table_lists_every_field_the_evaluator_reports():
    from rich.console import Console

    from mtrl_runtime.cli.demo import _table

    base = {"val/strict/success_rate": 0.06, "val/metrics/format_ok": 0.5, "val/metrics/field_acc": 0.27,
            "val/metrics/field_acc_decision": 0.22, "val/metrics/field_acc_incident_flag": 0.18}
    trained = {**base, "val/strict/success_rate": 0.08, "val/metrics/field_acc_decision": 0.58}
    console = Console(record=True, width=120)
    console.print(_table(base, trained))
    text = console.export_text()
    for label in ("strict task success", "answer well-formed", "decision", "incident_flag"):
        assert label in text
    assert "+0.360" in text  # decision 0.22 -> 0.58


def test_demo_hides_strands_log_lines_while_it_runs_and_restores_the_level(caplog):
    import logging

    from mtrl_runtime.cli.demo import _agent_logs

    logger = logging.getLogger("strands.tools.executors")
    before = logging.getLogger("strands").level
    with caplog.at_level(logging.WARNING):
        with _agent_logs(show=False):
            logger.warning("tool_name=<validation> | tool not found in registry")
        with _agent_logs(show=True):
            logger.warning("tool_name=<check_electrical> | tool not found in registry")
    messages = [r.getMessage() for r in caplog.records]
    assert not any("validation" in m for m in messages)
    assert any("check_electrical" in m for m in messages)
    assert logging.getLogger("strands").level == before
