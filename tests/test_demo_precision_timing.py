"""Issue 21 items 0 and 4: the CPU recipes' dtype comes from the CPU, benches record what they ran,
and the demo ends with its own timing split and the machine's load (tested on recorded timings)."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

import pytest
import yaml

from mtrl_runtime.cli._demo_timing import demo_timing, timing_lines
from mtrl_runtime.cli._load_sampler import SHARED_CPU_SHARE, LoadSampler, LoadSummary, load_verdict
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


def _load(loads, share, cpus=2):
    return LoadSummary(tuple(loads), interval_s=15.0, wall_s=620.0, cpus=cpus, others_cpu_share=share)


def test_the_timing_split_adds_the_steps_and_names_a_quiet_machine():
    timing = demo_timing(STEPS, training_s=170.0, evaluation_s=450.0, load=_load([2.1, 2.3, 2.0, 3.4], 0.04),
                         own_threads=2)
    assert (timing.rollouts_s, timing.update_s, timing.other_s, timing.total_s) == (100.5, 60.5, 9.0, 620.0)
    first, machine, load, verdict = timing_lines(timing, "precision: weights bf16")
    assert first == ("time: 10.3 min in all = training 2.8 min (2 steps, 85 s a step: rollouts 1.7 min, "
                     "update 1.0 min, other 9 s) + evaluation 7.5 min")
    assert machine == "machine: 2 CPU cores; precision: weights bf16"
    assert load == ("load while it ran (1-min average, 4 samples every 15 s): median 2.20, peak 3.40, above 3 in "
                    "25% of the samples; other processes' CPU 4% of the cores' time")
    assert verdict == ("the machine was quiet (other processes used 4% of the 2 cores' time while it ran): "
                       "these times are the run's own")


def test_a_run_shared_for_most_of_its_time_is_named_shared_though_it_ended_quiet():
    """The case the load average at the end got wrong: busy for 40 of 45 minutes, alone for the last five."""
    loads = [9.5] * 160 + [0.4] * 20  # every 15 s
    timing = demo_timing(STEPS, 170.0, 450.0, _load(loads, 0.62), own_threads=2)
    lines = timing_lines(timing, "p")
    assert lines[2].startswith("load while it ran (1-min average, 180 samples every 15 s): median 9.50, peak 9.50, "
                               "above 3 in 89% of the samples")
    assert lines[3].startswith("the machine was shared (other processes used 62% of the 2 cores' time while it ran)")
    # without /proc/stat the sampled median decides, and it says so
    no_proc = demo_timing(STEPS, 170.0, 450.0, _load(loads, None), own_threads=2)
    assert timing_lines(no_proc, "p")[3].startswith(
        "the machine was shared (the median load while it ran was 9.50, against the ~2 it adds by itself)")
    quiet = demo_timing(STEPS, 170.0, 450.0, _load([2.2, 2.4, 9.0], None), own_threads=2)
    assert timing_lines(quiet, "p")[3].startswith("the machine was quiet (the median load while it ran was 2.40")


def test_the_verdict_threshold_on_other_processes_cpu():
    assert load_verdict(_load([1.0], SHARED_CPU_SHARE), own_threads=2)[0] is True
    assert load_verdict(_load([9.0], SHARED_CPU_SHARE - 0.01), own_threads=2)[0] is False  # the CPU share decides


def test_the_sampler_samples_through_the_run_and_measures_other_processes_cpu():
    """Driven readers: a load that rises and falls, and a machine that spent 3 CPU-s of which 1 was this process."""
    loads = iter([1.0, 5.0, 6.0, 7.0, 0.5] + [0.5] * 100)
    clock = iter([100.0, 102.0])
    machine = iter([(50.0, 200.0), (53.0, 204.0)])  # busy, total CPU seconds since boot
    own = iter([10.0, 11.0])
    sampler = LoadSampler(0.01, read_load=lambda: next(loads), read_machine_cpu=lambda: next(machine),
                          read_own_cpu=lambda: next(own), clock=lambda: next(clock), cpus=2)
    with sampler:
        deadline = time.monotonic() + 5
        while len(sampler._loads) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    summary = sampler.stop()  # stopped once: the context manager's summary
    assert summary.loads[:4] == (1.0, 5.0, 6.0, 7.0) and summary.loads[-1] == 0.5
    assert summary.wall_s == 2.0 and summary.cpus == 2
    assert summary.others_cpu_share == pytest.approx(0.5)  # (3 - 1) / 4


def test_the_real_sampler_counts_a_process_it_did_not_wait_for_as_another_processes_cpu():
    """A child that spins for 1.5 s while this process sleeps, reaped only after the sampler stopped."""
    import subprocess

    spin = "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"
    with LoadSampler(0.05) as sampler:
        child = subprocess.Popen([sys.executable, "-c", spin])
        time.sleep(1.6)
    summary = sampler.stop()
    child.wait()
    assert len(summary.loads) >= 3 and all(load >= 0 for load in summary.loads)
    if not Path("/proc/stat").exists():
        assert summary.others_cpu_share is None
        return
    # at least the child's share of two cores' 1.6 s (it spins on one core alone on a quiet machine: ~0.45;
    # on a busy one other processes take the rest, and the share is higher)
    assert summary.others_cpu_share is not None and 0.2 <= summary.others_cpu_share <= 1.0, summary


def test_a_sampler_refuses_a_bad_interval_and_a_second_start():
    with pytest.raises(ValueError, match=r"interval_s: expected seconds > 0, got 0"):
        LoadSampler(0)
    sampler = LoadSampler(10.0).start()
    with pytest.raises(RuntimeError, match="already started"):
        sampler.start()
    sampler.stop()
    with pytest.raises(RuntimeError, match="never started"):
        LoadSampler(1.0).stop()


def test_a_step_without_its_timings_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"step_metrics\[1\]: no time/update"):
        demo_timing([STEPS[0], {"time/rollout": 1.0}], 10.0, 10.0, _load([0.0], None), own_threads=2)


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
