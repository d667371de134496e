"""Shared fixtures: the tiny tokenizer/model and a coordinator served on loopback."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
# One torch (OpenMP) thread per process, for the workers and every process a test starts (they inherit it): the
# README's three workers on 2 cores keep both cores busy, and a second torch thread then only adds OpenMP
# hand-offs. Measured on 2 cores under load: one scripted `mtrl train` step (docs/training.md's first block)
# took 25.1 and 28.1 s of CPU with torch's default 2 threads, 20.8 and 21.4 s with one. Set before any test
# imports torch; a test that is about threads gives its processes their own count (tests/test_torch_threads.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")


# The collector's first generation every 20,000 allocations instead of 700. A worker holds torch, transformers and
# every test module; each full collection walks all of it, and the tests' many short-lived objects set one off
# every few seconds. Measured in one process (tests/test_fuzz.py, test_training_learning.py,
# test_warmstart_traces.py, timed with gc.callbacks): 10.8 s of CPU collecting (68 full collections) of 84.6 s,
# against 5.5 s (8 full) of 78.0 s. Cyclic garbage lives longer between collections; nothing the tests check
# waits on the collector unasked (a test that needs it calls gc.collect()).
GC_FIRST_GENERATION = 20_000


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist: ``--dist loadgroup`` only, its groups honoured under pytest 9.2 (tests/_xdist_groups.py).
    In every process: the collector's thresholds (``GC_FIRST_GENERATION``)."""
    gc.set_threshold(GC_FIRST_GENERATION, *gc.get_threshold()[1:])
    if not config.pluginmanager.hasplugin("xdist"):
        return
    workers, dist = config.getoption("numprocesses"), config.getoption("dist")
    if workers and dist != "loadgroup":
        raise pytest.UsageError(
            f"--dist {dist}: this suite runs under pytest-xdist with --dist loadgroup only (pyproject's addopts "
            "sets it; drop --dist): a docs page's blocks and the Ray / torchrun tests are xdist groups "
            "(tests/_groups.py) that must each stay on one worker")
    from _xdist_groups import GroupPlugin

    config.pluginmanager.register(GroupPlugin(), "mtrl-xdist-groups")


# LangChain's chat models without an http client of their own share one cached async httpx client per process
# (per base URL); built on an earlier test's event loop, closed since, it fails a later test's calls ("Event loop is
# closed", "Connection error"). Each test starts without them; modules not loaded are not imported.
_LANGCHAIN_CLIENT_CACHES = {
    "langchain_openai.chat_models._client_utils": ("_cached_async_httpx_client", "_cached_sync_httpx_client"),
    "langchain_anthropic._client_utils": ("_get_default_async_httpx_client", "_get_default_httpx_client"),
}


def _clear_langchain_clients() -> None:
    for module_name, names in _LANGCHAIN_CLIENT_CACHES.items():
        module = sys.modules.get(module_name)
        for name in names if module is not None else ():
            cached = getattr(module, name, None)
            if cached is not None:
                cached.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_langchain_clients() -> Iterator[None]:
    _clear_langchain_clients()
    yield
    _clear_langchain_clients()


@pytest.fixture(scope="module")
def ray_temp_dir() -> Iterator[Path]:
    """A short temp folder for a Ray cluster's files (``ray.init(_temp_dir=...)``, ``ray start --temp-dir``).

    Ray's AF_UNIX sockets live at ``<dir>/session_<date>_<time>_<pid>/sockets/plasma_store``, at most 107
    bytes; pytest's ``tmp_path_factory`` folders under xdist (``/tmp/pytest-of-root/pytest-490/popen-gw0/
    raycluster0``) made that 114 and the head node died at startup.
    """
    folder = Path(tempfile.mkdtemp(prefix="ray-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
    """Start a coordinator on 127.0.0.1 over a given engine (on ``port``, default a free one); stopped at teardown."""
    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.server import create_app, start_server
    from mtrl_runtime.store import SQLiteStore

    started: list[tuple[Any, Any]] = []

    def start(engine: Any, config: MtrlConfig | None = None, port: int = 0) -> Any:
        config = config or MtrlConfig()
        store = SQLiteStore(tmp_path / f"store{len(started)}.db")
        coordinator = Coordinator(engine, store, config)
        handle = start_server(create_app(coordinator), "127.0.0.1", port)
        started.append((handle, store))
        handle.coordinator = coordinator  # type: ignore[attr-defined]
        handle.store = store  # type: ignore[attr-defined]
        return handle

    yield start
    for handle, store in started:
        handle.stop()
        store.close()
