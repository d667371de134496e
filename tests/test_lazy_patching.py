"""An SDK is patched when the agent's process has loaded it, never loaded by mtrl (``_patches.install_when_imported``).

``instrument()`` installs the patches of the SDKs already loaded and leaves
the import hook (``_on_import.ImportWatch``) watching the others' modules:
one loaded later is patched the moment its code has run, before its import
returns. Each case runs in a fresh interpreter (the import state is the
process's): a rollout's Anthropic call made by a client imported after
``instrument()`` is redirected and recorded exactly as one imported before;
botocore loaded after ``instrument()`` gets selective capture outside the
Bedrock redirect whichever layer lands first; an openai-only agent's
``instrument()`` loads none of the other SDKs; threads importing at once each
get the patched class; ``stop_watching`` leaves ``sys.meta_path`` as it was;
a Strands Agent built in a rollout that imported Strands inside it has mtrl's
hooks (and LangChain, MCP, langchain-mcp-adapters, the Agents SDK their layers).
"""

from __future__ import annotations

import functools
import json
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from _adapter_support import specs, tasks
from mtrl_adapters._patches import Patch, PatchSet
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import answer_text, family_tokenizer
from mtrl_runtime.types import RolloutStatus

TESTS = Path(__file__).parent
SDKS = ("anthropic", "botocore", "google.genai", "aiobotocore", "litellm")


def _python(code: str, *args: str) -> list[Any]:
    """Run ``code`` in a fresh interpreter; each line it prints, read as JSON."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                         cwd=TESTS.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


# ---------------------------------------------------------------------- (1) a rollout's client, imported later
AGENT = """
import json, pickle, sys
import openai  # the agent's own SDK, loaded before any rollout
from mtrl_adapters import rollout, rollout_scope
from mtrl_adapters._patches import PATCHES
spec = pickle.loads(bytes.fromhex(sys.argv[1]))
first = sys.argv[2] == "first"
if first:
    import anthropic

@rollout
def agent(task):
    loaded_at_start = "anthropic" in sys.modules  # instrument() has run: it must not have loaded anthropic
    import anthropic
    client = anthropic.Anthropic(api_key="sk-ant-user-real-key", max_retries=0)
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=64,
                                   messages=[{"role": "user", "content": task.prompt}])
    return loaded_at_start, reply.content[-1].text

with rollout_scope(spec):
    loaded_at_start, text = agent(spec.task)
import anthropic._base_client as base
loader = base.__spec__.loader
print(json.dumps([loaded_at_start, text, PATCHES.layers_on(base.BaseClient, "_build_request"),
                  PATCHES.layers_on(base.SyncAPIClient, "request"), type(loader).__name__,
                  "exec_module" in vars(loader), PATCHES._imports in sys.meta_path]))
"""


def test_an_anthropic_client_imported_after_instrument_is_redirected_and_recorded_as_one_imported_before(served):
    pytest.importorskip("anthropic")
    engine = ScriptedEngine(family_tokenizer("hermes"),
                            lambda request, prompt: answer_text("hermes", f"seen {prompt.count('K0')} keys. DONE"))
    handle = served(engine, MtrlConfig.coerce({"advanced": {"chat_format": "hermes"}}))
    recorded = {}
    for when in ("first", "later"):
        [spec] = specs(handle, tasks(1))
        [[loaded_at_start, text, redirect, selective, loader, wrapped, hooked]] = _python(
            AGENT, pickle.dumps(spec).hex(), when)
        assert loaded_at_start is (when == "first")
        assert text == "seen 1 keys. DONE" and redirect == ["redirect"] and selective == ["selective"], when
        assert loader == "SourceFileLoader" and wrapped is False  # the module's own loader, given back
        assert hooked is True  # still watching botocore, google.genai, ... for this process
        record = handle.store.get_rollout(spec.rollout_id)
        assert record.status is RolloutStatus.COMPLETED, (when, record.error)
        [turn] = record.turns
        recorded[when] = (turn.prompt_ids, turn.completion_ids, turn.completion_text, turn.messages)
    assert recorded["later"] == recorded["first"]  # the same turn, token for token


# ---------------------------------------------------------------------- (2) botocore after instrument()
BOTOCORE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from mtrl_adapters import instrument_bedrock
from mtrl_adapters._decorator import instrument
from mtrl_adapters._patches import PATCHES
from mtrl_adapters._selective import instrument_selective
steps = {"instrument": instrument, "redirect": instrument_bedrock, "selective": instrument_selective,
         "import": lambda: __import__("botocore.client")}
for step in sys.argv[2].split(","):
    steps[step]()
    if step != "import":
        assert "botocore" not in sys.modules or "botocore.client" in sys.modules, step
import botocore.client
from test_patches import _judge_call_attaches_the_redirect
attached, calls = _judge_call_attaches_the_redirect()
print(json.dumps([PATCHES.layers_on(botocore.client.BaseClient, "_make_api_call"), attached,
                  [(c.model, c.status) for c in calls]]))
"""


@pytest.mark.parametrize("steps", ["instrument,import", "redirect,import,selective", "selective,import,redirect",
                                   "import,redirect,selective"])
def test_botocore_loaded_after_instrument_gets_both_layers_in_the_declared_order(steps):
    """Whichever layer lands first (at the import, or at a call after it), selective runs outside the redirect:
    a judge's Converse call inside a rollout reaches the redirect with no rollout and is recorded as passing by."""
    pytest.importorskip("botocore")
    [[layers, attached, calls]] = _python(BOTOCORE, str(TESTS), steps)
    assert layers == ["selective", "redirect"]
    assert attached is False and calls == [["judge", "success"]]


# ---------------------------------------------------------------------- (3) nothing loaded for the agent
def test_instrument_in_an_openai_only_process_loads_no_other_sdk_and_asks_the_path_nothing():
    code = """
import importlib.util, json, sys
import openai
from mtrl_adapters._decorator import instrument
from mtrl_adapters._patches import PATCHES
asked = []
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: asked.append(name) or real(name, *a)
instrument(); instrument()
print(json.dumps([[m for m in %r if m in sys.modules], asked,
                  PATCHES.layers_on(openai._base_client.BaseClient, "_build_request"),
                  PATCHES.layers_on(openai._base_client.AsyncAPIClient, "request"), sorted(PATCHES.waiting())]))
""" % (SDKS,)
    [[loaded, asked, redirect, selective, waiting]] = _python(code)
    assert loaded == [] and asked == []
    assert redirect == ["redirect"] and selective == ["selective"]
    assert {"anthropic._base_client", "botocore.client", "google.genai._api_client"} <= set(waiting)


# ---------------------------------------------------------------------- (4) imports racing from threads
def _tracing(name: str, trace: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(self: Any, *args: Any) -> Any:
            trace.append(name)
            return original(self, *args)

        return method

    return wrap


@pytest.fixture
def slow_sdk(tmp_path, monkeypatch):
    """A module whose code takes 0.4 s: imports of it from several threads pile up on its import lock."""
    (tmp_path / "mtrl_lazy_sdk.py").write_text(
        "import time\ntime.sleep(0.4)\n\nclass Client:\n    def call(self, x):\n        return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mtrl_lazy_sdk", raising=False)
    patches = PatchSet(("outer", "inner"))
    yield patches
    patches.stop_watching()
    sys.modules.pop("mtrl_lazy_sdk", None)


def test_threads_importing_a_watched_module_each_get_the_patched_class(slow_sdk):
    trace: list[str] = []
    layers = [Patch("mtrl_lazy_sdk:Client", "call", name, _tracing(name, trace)) for name in ("inner", "outer")]
    assert slow_sdk.install_when_imported(layers[:1]) is False and "mtrl_lazy_sdk" not in sys.modules
    barrier, seen = threading.Barrier(8), []

    def use(i: int) -> None:
        barrier.wait()
        if i == 0:  # the other layer lands while the imports run: it joins the wait, or installs after it
            seen.append(("installed", slow_sdk.install_when_imported(layers[1:])))
            return
        import mtrl_lazy_sdk

        seen.append(("layers", slow_sdk.layers_on(mtrl_lazy_sdk.Client, "call")))

    workers = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    import mtrl_lazy_sdk

    assert slow_sdk.layers_on(mtrl_lazy_sdk.Client, "call") == ("outer", "inner")
    assert all(layers_ and layers_[-1] == "inner" for kind, layers_ in seen if kind == "layers"), seen
    assert mtrl_lazy_sdk.Client().call(1) == 2 and trace == ["outer", "inner"]
    assert slow_sdk.waiting() == {} and not slow_sdk._imports.is_watching("mtrl_lazy_sdk")  # nothing left


def test_an_install_during_another_threads_import_waits_for_it_and_installs(slow_sdk):
    import importlib
    import time

    importer = threading.Thread(target=importlib.import_module, args=("mtrl_lazy_sdk",))
    importer.start()
    while "mtrl_lazy_sdk" not in sys.modules:  # begun (its find_spec passed before the watch): half made
        time.sleep(0.01)
    trace: list[str] = []
    assert slow_sdk.install_when_imported([Patch("mtrl_lazy_sdk:Client", "call", "inner", _tracing("i", trace))])
    importer.join()
    assert sys.modules["mtrl_lazy_sdk"].Client().call(1) == 2 and trace == ["i"]


def test_real_sdks_imported_from_threads_after_instrument_are_patched_when_their_import_returns():
    pytest.importorskip("anthropic")
    pytest.importorskip("google.genai")
    code = """
import importlib, json, sys, threading
from mtrl_adapters._decorator import instrument
from mtrl_adapters._patches import PATCHES
instrument()
targets = [("anthropic", "anthropic._base_client", "SyncAPIClient", "request"),
           ("anthropic", "anthropic._base_client", "BaseClient", "_build_request"),
           ("botocore.session", "botocore.client", "BaseClient", "_make_api_call"),
           ("google.genai", "google.genai._api_client", "BaseApiClient", "request"),
           ("openai", "openai._base_client", "BaseClient", "_build_request")] * 3
barrier, seen = threading.Barrier(len(targets) + 1), []
def use(package, module, cls, method):
    barrier.wait()
    importlib.import_module(package)
    seen.append([module, method, PATCHES.layers_on(getattr(sys.modules[module], cls), method)])
workers = [threading.Thread(target=use, args=t) for t in targets]
for w in workers: w.start()
barrier.wait(); instrument()  # one more rollout starting while they import
for w in workers: w.join()
print(json.dumps(sorted(seen)))
"""
    [seen] = _python(code)
    assert len(seen) == 15
    expected = {"request": ["selective"], "_build_request": ["redirect"], "_make_api_call": ["selective", "redirect"]}
    for module, method, layers in seen:
        assert layers == expected[method], (module, method, layers)


# ---------------------------------------------------------------------- (5) uninstall
def test_stop_watching_restores_the_meta_path_and_patches_nothing_later():
    pytest.importorskip("anthropic")
    code = """
import json, sys
from mtrl_adapters._decorator import instrument
from mtrl_adapters._patches import PATCHES
before = list(sys.meta_path)
instrument()
hooked = PATCHES._imports in sys.meta_path
PATCHES.stop_watching()
import anthropic._base_client as base
print(json.dumps([hooked, sys.meta_path == before, PATCHES.waiting(),
                  PATCHES.layers_on(base.BaseClient, "_build_request"), "exec_module" in vars(base.__loader__)]))
instrument()  # the next rollout: anthropic is loaded now, so it is patched now
print(json.dumps(PATCHES.layers_on(base.BaseClient, "_build_request")))
"""
    [[hooked, restored, waiting, layers, wrapped], after] = _python(code)
    assert hooked is True and restored is True and waiting == {} and layers == [] and wrapped is False
    assert after == ["redirect"]


# ---------------------------------------------------------------------- frameworks loaded inside the rollout
def test_frameworks_imported_inside_a_rollout_are_instrumented_before_their_first_object():
    """Strands, LangChain, the MCP SDK, langchain-mcp-adapters and the OpenAI Agents SDK imported after the
    rollout began: a Strands Agent built in that rollout already carries mtrl's hooks."""
    for name in ("strands", "langchain_core", "mcp", "langchain_mcp_adapters", "agents"):
        pytest.importorskip(name)
    code = """
import json, sys
from mtrl_adapters import RolloutContext, rollout_scope
from mtrl_adapters._decorator import instrument
from mtrl_adapters._patches import PATCHES
ctx = RolloutContext(rollout_id="r-lazy", token="t", endpoint="http://127.0.0.1:9")
with rollout_scope(ctx):
    instrument()  # the rollout's start
    loaded = [m for m in ("strands", "langchain_core", "mcp", "agents") if m in sys.modules]
    import strands
    from strands.models.openai import OpenAIModel
    agent = strands.Agent(model=OpenAIModel(client_args={"api_key": "k"}, model_id="policy"))
    import langchain_core.messages, mcp.client.session, langchain_mcp_adapters.tools, agents
from langchain_core.tracers import context
from agents.mcp.util import MCPUtil
from mtrl_adapters.langgraph import _HANDLER
from mtrl_adapters.strands import _REGISTERED, MtrlHooks
print(json.dumps([loaded, PATCHES.layers_on(strands.Agent, "__init__"),
                  isinstance(getattr(agent.hooks, _REGISTERED, None), MtrlHooks),
                  any(entry[0] is _HANDLER for entry in context._configure_hooks),
                  PATCHES.layers_on(mcp.client.session.ClientSession, "call_tool"),
                  PATCHES.layers_on(langchain_mcp_adapters.tools, "_build_interceptor_chain"),
                  PATCHES.layers_on(MCPUtil, "invoke_mcp_tool")]))
"""
    [[loaded, strands_layers, hooked, langchain, mcp_layers, adapters_layers, agents_layers]] = _python(code)
    assert loaded == []
    assert strands_layers == ["hooks"] and hooked is True
    assert langchain is True and mcp_layers == ["observe"] and adapters_layers == ["observe"]
    assert agents_layers == ["observe"]


def test_an_adapter_module_imported_before_its_framework_imports_cleanly_and_the_next_rollout_instruments():
    """``import mtrl_adapters.strands`` (and the others) after ``instrument()`` loads the framework from inside the
    adapter's own import, before the adapter's names exist: the hook must not fail that import; the next
    rollout's ``instrument()`` installs the layer."""
    for name in ("strands", "langchain_core", "agents"):
        pytest.importorskip(name)
    code = """
import json
from mtrl_adapters._decorator import instrument
from mtrl_adapters._patches import PATCHES
instrument()
import mtrl_adapters.strands, mtrl_adapters.openai_agents, mtrl_adapters.langgraph
import strands
from agents.mcp.util import MCPUtil
before = [PATCHES.layers_on(strands.Agent, "__init__"), PATCHES.layers_on(MCPUtil, "invoke_mcp_tool")]
instrument()
print(json.dumps([before, [PATCHES.layers_on(strands.Agent, "__init__"), PATCHES.layers_on(MCPUtil, "invoke_mcp_tool")]]))
"""
    [[_, after]] = _python(code)
    assert after == [["hooks"], ["observe"]]
