"""The config refuses an unknown algorithm, engine or group policy at load, naming the key, value and choices."""

from __future__ import annotations

import pytest

from mtrl_runtime.algorithms import ADVANTAGES, LOSSES
from mtrl_runtime.config import ConfigError, GroupPolicyConfig, MtrlConfig
from mtrl_runtime.engines import ENGINES
from mtrl_runtime.rollouts import GROUP_POLICIES


@pytest.mark.parametrize(
    ("key", "value", "registry"),
    [("advantage_method", "grpo", ADVANTAGES), ("loss_fn", "dpo", LOSSES), ("engine", "sglang", ENGINES)],
)
def test_an_unknown_name_fails_at_load_naming_key_value_and_the_known_names(key, value, registry):
    with pytest.raises(ConfigError) as info:
        MtrlConfig.from_dict({"core": {key: value}})
    message = str(info.value)
    assert f"core.{key}" in message and repr(value) in message
    assert all(name in message for name in registry.names())


def test_every_registered_name_is_accepted(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder: the teacher the distill loss cannot go without
    companions = {"distill": {"distill_teacher": str(tmp_path)}}
    for name in ADVANTAGES.names():
        assert MtrlConfig.from_dict({"core": {"advantage_method": name}}).core.advantage_method == name
    for name in LOSSES.names():
        loaded = MtrlConfig.from_dict({"core": {"loss_fn": name}, "advanced": companions.get(name, {})})
        assert loaded.core.loss_fn == name
    for name in ENGINES.names():
        assert MtrlConfig.from_dict({"core": {"engine": name}}).core.engine == name


def test_an_unknown_name_set_on_a_loaded_config_fails_too():
    config = MtrlConfig()
    with pytest.raises(ValueError, match="unknown advantage method 'grpo'"):
        config.core.advantage_method = "grpo"
    assert config.core.advantage_method == "group_based"


def test_the_group_policies_the_config_accepts_are_the_registered_ones():
    for name in GROUP_POLICIES.names():  # the registry is the list: a registered policy is accepted by name
        assert GroupPolicyConfig(on_failure=name).on_failure == name
        loaded = MtrlConfig.from_dict({"advanced": {"group_policy": {"on_failure": name}}})
        assert loaded.advanced.group_policy.on_failure == name
    with pytest.raises(ConfigError, match="advanced.group_policy.on_failure.*'retry_forever'"):
        MtrlConfig.from_dict({"advanced": {"group_policy": {"on_failure": "retry_forever"}}})


def test_the_group_policy_is_checked_against_the_registry_at_load_and_on_assignment(monkeypatch):
    with pytest.raises(ConfigError) as info:
        MtrlConfig.from_dict({"advanced": {"group_policy": {"on_failure": "retry_forever"}}})
    assert all(name in str(info.value) for name in GROUP_POLICIES.names())
    config = MtrlConfig()
    with pytest.raises(ValueError, match="unknown group policy 'drop_all'"):
        config.advanced.group_policy.on_failure = "drop_all"
    assert config.advanced.group_policy.on_failure == "keep_survivors"
    # a policy registered later is accepted by name: the config reads the registry, not a list of its own
    monkeypatch.setitem(GROUP_POLICIES._items, "keep_all", GROUP_POLICIES.get("keep_survivors"))
    loaded = MtrlConfig.from_dict({"advanced": {"group_policy": {"on_failure": "keep_all"}}})
    assert loaded.advanced.group_policy.on_failure == "keep_all"


def test_coerce_takes_a_config_a_mapping_or_a_yaml_path_and_refuses_anything_else(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("core:\n  max_steps: 3\n")
    original = MtrlConfig()
    copied = MtrlConfig.coerce(original)
    assert copied == original and copied is not original
    assert MtrlConfig.coerce({"core": {"max_steps": 4}}).core.max_steps == 4
    assert MtrlConfig.coerce(path).core.max_steps == 3 and MtrlConfig.coerce(str(path)).core.max_steps == 3
    assert MtrlConfig.coerce(None) == MtrlConfig()
    with pytest.raises(ConfigError, match="config: expected an MtrlConfig, a mapping or a YAML path, got int"):
        MtrlConfig.coerce(3)  # type: ignore[arg-type]
