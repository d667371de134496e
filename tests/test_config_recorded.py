"""What a run records of its config (MLflow params, the store's run_config): every value, secrets masked."""

from __future__ import annotations

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.tracking import flatten_params


def test_recorded_config_masks_the_server_secrets_and_keeps_the_rest() -> None:
    config = MtrlConfig.from_dict({"core": {"max_steps": 7}, "advanced": {"server": {
        "api_key": "sk-live-123", "sagemaker_access_key_id": "AKIAEXAMPLE", "sagemaker_secret": "wJalr/secret"}}})
    recorded = config.recorded()
    assert recorded["advanced"]["server"]["api_key"] == "**********"
    assert recorded["advanced"]["server"]["sagemaker_secret"] == "**********"
    assert recorded["advanced"]["server"]["sagemaker_access_key_id"] == "AKIAEXAMPLE"  # an id, not a secret
    assert recorded["core"]["max_steps"] == 7
    params = flatten_params(recorded)
    assert not any("sk-live-123" in v or "wJalr" in v for v in params.values())
    assert config.advanced.server.api_key == "sk-live-123"  # the running config keeps what it needs


def test_recorded_config_leaves_unset_secrets_unset() -> None:
    recorded = MtrlConfig().recorded()
    assert recorded["advanced"]["server"]["api_key"] is None
    assert MtrlConfig.from_dict(recorded) == MtrlConfig()  # round-trips: rescore reloads it
