"""A run's files are named by one value (``RunFolder``), and ``core.store`` picks the store backend from its registry.

The store contract itself runs on the config-chosen memory backend in
tests/test_store_contract.py; here a real collection (the scripted engine,
an OpenAI-client agent on loopback) records into the backend the config
names.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.run_folder import RunFolder
from mtrl_runtime.store import STORES, open_store
from mtrl_runtime.store.memory import MemoryStore

sys.path.insert(0, str(Path(__file__).resolve().parent))


def test_a_run_folder_names_every_file_of_a_run(tmp_path: Path) -> None:
    folder = RunFolder(str(tmp_path / "run"))
    root = tmp_path / "run"
    assert folder.root == root
    assert (folder.store, folder.adapter, folder.pushed_adapters, folder.checkpoints) == (
        root / "trajectories.db", root / "adapter", root / "adapters", root / "checkpoints")
    assert (folder.mlflow_db, folder.mlflow_artifacts, folder.diagnostics) == (
        root / "mlflow.db", root / "mlartifacts", root / "diagnostics.jsonl")
    assert (folder.evaluation, folder.checks) == (root / "eval", root / "checks")
    assert folder.mlflow_uri == f"sqlite:///{root.resolve() / 'mlflow.db'}"
    assert MtrlConfig.from_dict({"core": {"run_dir": str(root)}}).run_folder == folder


def test_the_saved_adapter_is_found_only_when_the_trainer_wrote_one(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    assert folder.saved_adapter() is None
    folder.adapter.mkdir()
    assert folder.saved_adapter() is None  # an empty folder is no adapter
    (folder.adapter / "adapter_config.json").write_text("{}")
    assert folder.saved_adapter() == tmp_path / "adapter"


def test_the_parts_that_write_a_run_folder_ask_the_run_folder(tmp_path: Path) -> None:
    from mtrl_runtime.monitor import DiagnosticsMonitor
    from mtrl_runtime.tracking import default_tracking_uri

    config = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}})
    assert default_tracking_uri(config.run_dir) == config.run_folder.mlflow_uri
    assert DiagnosticsMonitor.for_config(config).path == config.run_folder.diagnostics


def test_core_store_defaults_to_sqlite_and_accepts_every_registered_backend() -> None:
    assert MtrlConfig().core.store == "sqlite"
    for name in STORES.names():
        assert MtrlConfig.from_dict({"core": {"store": name}}).core.store == name


def test_an_unknown_store_backend_fails_at_load_naming_the_key_the_value_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        MtrlConfig.from_dict({"core": {"store": "postgres"}})
    message = str(info.value)
    assert "core.store" in message and "'postgres'" in message
    assert all(name in message for name in STORES.names())
    config = MtrlConfig()
    with pytest.raises(ValueError, match="unknown store backend 'redis'"):
        config.core.store = "redis"
    assert config.core.store == "sqlite"


def test_a_memory_store_cannot_be_opened_read_only_to_read_a_run_back(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="store backend 'memory' keeps nothing.*core.store: memory"):
        open_store(tmp_path / "trajectories.db", "memory", read_only=True)
    with pytest.raises(FileNotFoundError):  # the sqlite file a run folder is read from: absent, not created
        open_store(tmp_path / "trajectories.db", read_only=True)
    assert not (tmp_path / "trajectories.db").exists()


TASKS = [{"id": "look", "prompt": "What is the value under A1?"}, {"id": "other", "prompt": "Say anything."}]
SCRIPT = {"tasks": [{"match": "value under A1", "replies": [{"tool_call": {"name": "lookup",
                                                                           "arguments": {"key": "A1"}}},
                                                            "ANSWER 42"]},
                    {"replies": ["ANSWER 0"]}]}


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_collection_records_into_the_backend_core_store_names(tmp_path: Path, tiny_model_dir: Path, backend: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from _collect_agent import agent

    from mtrl_runtime.rollouts import RolloutStack, collect_rollouts, load_tasks

    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    config = MtrlConfig.from_dict({
        "core": {"engine": "scripted", "model": str(tiny_model_dir), "run_dir": str(tmp_path / "run"),
                 "group_size": 2, "max_turns": 4, "store": backend},
        "advanced": {"rollout_timeout_s": 30, "engine_options": {"script_file": str(tmp_path / "script.json")}},
    })
    stores = []
    build = RolloutStack.build

    def recording(*args, **kwargs):  # the stack collect_rollouts builds: which store did it open?
        stack = build(*args, **kwargs)
        stores.append(stack.store)
        return stack

    monkeypatch.setattr(RolloutStack, "build", recording)
    collected = asyncio.run(collect_rollouts(config, agent, load_tasks(TASKS)))
    assert sorted(r.status.value for r in collected.rollouts) == ["completed"] * 4
    [store] = stores
    assert type(store) is STORES.get(backend)
    assert config.run_folder.store.is_file() == (backend == "sqlite")  # memory: nothing written to the run folder
    if isinstance(store, MemoryStore):
        assert store.path == config.run_folder.store
