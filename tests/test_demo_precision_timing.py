"""Issue 21 items 0 and 4: the CPU recipes' dtype comes from the CPU, benches record what they ran,
and the demo ends with its own timing split and the machine's load (tested on recorded timings)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import yaml

from mtrl_runtime.cli._demo_timing import demo_timing, timing_lines
from mtrl_runtime.cli._precision import resolve_precision
from mtrl_runtime.cli.demo import DEMO_RECIPE
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.torch_support import cpu_has_native_bf16

REPO = Path(__file__).resolve().parents[1]


def test_the_cpu_recipes_never_force_bf16():
    assert DEMO_RECIPE["advanced"]["engine_options"]["dtype"] == "auto"
    for path in [REPO / "recipes" / "cpu-small.yaml", REPO / "examples" / "aircraft_inspection" / "config.yaml"]:
        data = yaml.safe_load(path.read_text())
        assert data["advanced"]["engine_options"]["dtype"] == "auto", path
        assert data["advanced"].get("precision", "auto") == "auto", path


def test_auto_resolves_to_what_this_cpu_runs_natively_and_is_recorded_in_the_config():
    config, line = resolve_precision(MtrlConfig.from_dict(DEMO_RECIPE))
    expected = "bf16" if cpu_has_native_bf16() else "fp32"
    assert config.advanced.engine_options["dtype"] == expected
    assert config.advanced.precision == expected
    assert config.advanced.engine_options["num_threads"] == 2  # the other options are kept
    assert f"weights {expected}, update {expected} (chosen;" in line
    assert ("natively" in line) == cpu_has_native_bf16()
    # the run's params come from config.model_dump(): they now hold the resolved dtype, not "auto"
    assert config.model_dump()["advanced"]["engine_options"]["dtype"] == expected


def test_a_named_dtype_is_kept_and_other_engines_are_left_alone():
    named = MtrlConfig.from_dict(DEMO_RECIPE).with_overrides({"advanced.engine_options.dtype": "fp32",
                                                              "advanced.precision": "fp32"})
    config, line = resolve_precision(named)
    assert config == named and "weights fp32, update fp32 (as configured;" in line
    vllm = MtrlConfig.from_yaml(REPO / "recipes" / "qwen3-0.6b.yaml")
    assert resolve_precision(vllm) == (vllm, "precision: as the vllm engine chooses")


STEPS = [  # time/* of a demo run's step reports (recorded from a quiet 2-core run's progress lines)
    {"time/rollout": 52.0, "time/rollout_wait": 52.0, "time/update": 31.0, "time/step": 85.0},
    {"time/rollout": 48.5, "time/rollout_wait": 48.5, "time/update": 29.5, "time/step": 80.0},
]


def test_the_timing_split_adds_the_steps_and_names_a_quiet_machine():
    timing = demo_timing(STEPS, training_s=170.0, evaluation_s=450.0, load_avg=(2.1, 2.3, 2.0), cpus=2,
                         own_threads=2)
    assert (timing.rollouts_s, timing.update_s, timing.other_s, timing.total_s) == (100.5, 60.5, 9.0, 620.0)
    first, machine, verdict = timing_lines(timing, "precision: weights bf16")
    assert first == ("time: 10.3 min in all = training 2.8 min (2 steps, 85 s a step: rollouts 1.7 min, "
                     "update 1.0 min, other 9 s) + evaluation 7.5 min")
    assert machine == "machine: 2 CPU cores, load average 2.10 / 2.30 / 2.00 (1 / 5 / 15 min); precision: weights bf16"
    assert verdict.startswith("the machine was quiet")


def test_a_loaded_machine_is_named_as_the_cause():
    timing = demo_timing(STEPS, 170.0, 450.0, (9.5, 8.0, 7.2), cpus=2, own_threads=2)
    assert timing_lines(timing, "p")[2].startswith("the machine was shared: the load was above the ~2")


def test_a_step_without_its_timings_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"step_metrics\[1\]: no time/update"):
        demo_timing([STEPS[0], {"time/rollout": 1.0}], 10.0, 10.0, (0.0, 0.0, 0.0), cpus=2, own_threads=2)


def test_every_bench_records_the_dtype_it_ran():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from _machine import machine_info
    finally:
        sys.path.remove(str(REPO / "bench"))
    info = machine_info((0.1,), (0.2,), 2, dtype={"SmolLM2": "bf16"})
    assert info["cpu_native_bf16"] == cpu_has_native_bf16() and info["dtype"] == {"SmolLM2": "bf16"}
    with pytest.raises(ValueError, match="dtype"):
        machine_info((0.1,), (0.2,), 2, dtype="")
    for path in sorted((REPO / "bench").glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "machine_info"]
        keys = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert all(any(k.arg == "dtype" for k in c.keywords) for c in calls), path.name
        assert calls or "dtype" in keys, f"{path.name}: its results record no dtype (use _machine.machine_info)"


def test_the_demo_trains_one_version_behind_unless_staleness_says_otherwise_and_a_bad_value_is_named():
    from mtrl_runtime.cli.demo import demo_config, training_mode

    recipe = demo_config()
    assert (recipe.advanced.async_config.enabled, recipe.advanced.async_config.max_steps_off_policy) == (True, 1)
    assert training_mode(recipe) == "asynchronous (rollouts at most 1 version(s) behind)"
    two = demo_config(steps=3, staleness=2)
    assert two.core.max_steps == 3
    assert (two.advanced.async_config.enabled, two.advanced.async_config.max_steps_off_policy) == (True, 2)
    synchronous = demo_config(staleness=0)
    assert training_mode(synchronous) == "synchronous" and not synchronous.advanced.async_config.enabled
    with pytest.raises(SystemExit, match=r"--staleness: expected an int >= 0, got -1"):
        demo_config(staleness=-1)
