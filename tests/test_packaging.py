"""Packaging: every package is installed, the agent side stays light, the config validates."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mtrl_runtime.config import ConfigError, MtrlConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    mapping = {"integrations": "mtrl_integrations", "examples": "mtrl_examples"}
    found = set()
    for top in ("mtrl_adapters", "mtrl_runtime", "integrations", "examples"):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = list(init.parent.relative_to(ROOT).parts)
            parts[0] = mapping.get(parts[0], parts[0])
            found.add(".".join(parts))
    assert found == listed, f"pyproject lists {sorted(listed)}, folders are {sorted(found)}"


def test_adapters_import_without_torch_or_the_runtime():
    code = (
        "import sys, mtrl_adapters, mtrl_adapters.wire\n"
        "bad = [m for m in ('torch', 'transformers', 'mtrl_runtime', 'fastapi') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_runtime_package_import_has_no_heavy_side_effects():
    code = "import sys, mtrl_runtime, mtrl_runtime.types, mtrl_runtime.config\nassert 'torch' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_defaults_follow_the_design():
    cfg = MtrlConfig()
    assert cfg.core.group_size == 8 and cfg.core.train_batch_size == 128
    assert cfg.core.advantage_method == "group_based" and cfg.core.loss_fn == "ppo"
    assert (cfg.core.lora_rank, cfg.core.lora_alpha, cfg.core.learning_rate) == (32, 64, 4e-5)
    assert cfg.core.sampling_params.max_tokens == 4096
    assert cfg.core.pass_k_values == [1, 2, 4, 8, 16, 32]
    assert (cfg.core.max_steps, cfg.core.val_every, cfg.core.success_threshold) == (50, 10, 1.0)
    assert cfg.advanced.async_config.max_steps_off_policy == 0
    assert cfg.advanced.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    "data, needles",
    [
        ({"core": {"group_sise": 4}}, ["core.group_sise", "unknown key", "4"]),
        ({"core": {"group_size": 0}}, ["core.group_size", "0"]),
        ({"advanced": {"async_config": {"max_steps_off_policy": -1}}}, ["max_steps_off_policy", "-1"]),
        ({"core": {"sampling_params": {"top_p": 1.5}}}, ["core.sampling_params.top_p", "1.5"]),
        ({"bogus": True}, ["bogus", "unknown key"]),
    ],
)
def test_config_errors_name_the_key_and_the_value(data, needles):
    with pytest.raises(ConfigError) as err:
        MtrlConfig.from_dict(data)
    for needle in needles:
        assert needle in str(err.value)


def test_config_loads_from_yaml_and_reports_the_file(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("core:\n  group_size: 4\n  max_steps: 3\nadvanced:\n  async_config:\n    enabled: true\n")
    cfg = MtrlConfig.from_yaml(good)
    assert cfg.core.group_size == 4 and cfg.advanced.async_config.enabled
    bad = tmp_path / "bad.yaml"
    bad.write_text("core:\n  lora_rank: many\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*core.lora_rank.*many"):
        MtrlConfig.from_yaml(bad)
    assert cfg.with_overrides({"core.max_steps": 7}).core.max_steps == 7
    with pytest.raises(ConfigError, match="nope"):
        cfg.with_overrides({"nope.x": 1})
