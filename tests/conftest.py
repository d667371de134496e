"""Shared fixtures: the tiny tokenizer/model and a coordinator served on loopback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")


@pytest.fixture(scope="session")
def tiny_tok() -> Any:
    from mtrl_runtime.testing import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mtrl_runtime.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start a coordinator on 127.0.0.1 over a given engine; stopped at teardown."""
    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.server import create_app, start_server
    from mtrl_runtime.store import SQLiteStore

    started: list[tuple[Any, Any]] = []

    def start(engine: Any, config: MtrlConfig | None = None) -> Any:
        config = config or MtrlConfig()
        store = SQLiteStore(tmp_path / f"store{len(started)}.db")
        coordinator = Coordinator(engine, store, config)
        handle = start_server(create_app(coordinator), "127.0.0.1", 0)
        started.append((handle, store))
        handle.coordinator = coordinator  # type: ignore[attr-defined]
        handle.store = store  # type: ignore[attr-defined]
        return handle

    yield start
    for handle, store in started:
        handle.stop()
        store.close()
