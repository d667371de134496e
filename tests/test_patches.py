"""The one patch mechanism of mtrl_adapters (``_patches``): declared layers, one installed wrapper per method.

Install twice is once; layers on one method run in the set's declared order
whatever order they were installed in, on toy classes and on botocore's own
``BaseClient._make_api_call`` (selective capture outside the Bedrock
redirect, shown by what a judge's Converse call does to its client); the
last uninstall restores the original object itself (or no own attribute,
where the method was inherited); installs race safely from threads; a
target that is not there is named in the error.
"""

from __future__ import annotations

import functools
import random
import threading
from typing import Any, Callable

import pytest

from mtrl_adapters import RolloutContext, rollout_scope
from mtrl_adapters._patches import MARK, ORIGINAL, PATCHES, Patch, PatchSet, PatchTargetMissing

LAYERS = ("outer", "middle", "inner")


def tracing(name: str, trace: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A wrap factory whose layer notes its name, then calls the next callable inward."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(self: Any, *args: Any) -> Any:
            trace.append(name)
            return original(self, *args)

        return method

    return wrap


def make_owner() -> type:
    class Owner:
        def call(self, x: int) -> int:
            return x + 1

    return Owner


# ---------------------------------------------------------------------- install once
def test_install_twice_is_install_once():
    owner, trace, patches = make_owner(), [], PatchSet(LAYERS)
    original = owner.__dict__["call"]
    patch = Patch(owner, "call", "middle", tracing("middle", trace))
    assert patches.install(patch) is True
    wrapper = owner.call
    assert patches.install(patch) is False and owner.call is wrapper  # nothing rebuilt, nothing stacked
    assert owner().call(1) == 2 and trace == ["middle"]  # the layer runs once per call
    assert getattr(wrapper, ORIGINAL) is original and getattr(wrapper, MARK).patches == (patch,)
    assert patches.layers_on(owner, "call") == ("middle",)


def test_the_real_redirects_install_once():
    from mtrl_adapters import instrument_bedrock, instrument_openai
    from mtrl_adapters._decorator import instrument

    instrument()  # every layer of the process, or already there from an earlier rollout
    import botocore.client
    import openai._base_client

    wrappers = (botocore.client.BaseClient._make_api_call, openai._base_client.BaseClient._build_request)
    instrument()
    assert instrument_bedrock() is False and instrument_openai() is False
    assert (botocore.client.BaseClient._make_api_call, openai._base_client.BaseClient._build_request) == wrappers


# ---------------------------------------------------------------------- the declared order
@pytest.mark.parametrize("seed", range(6))
def test_layers_run_in_the_declared_order_whatever_the_install_order(seed):
    owner, trace, patches = make_owner(), [], PatchSet(LAYERS)
    order = list(LAYERS)
    random.Random(seed).shuffle(order)
    for name in order:
        patches.install(Patch(owner, "call", name, tracing(name, trace)))
    assert owner().call(1) == 2
    assert trace == ["outer", "middle", "inner"], f"installed as {order}"
    assert patches.layers_on(owner, "call") == LAYERS
    assert getattr(owner.call, ORIGINAL) is getattr(owner.call, MARK).original  # one installed function, marked


@pytest.fixture
def bare_botocore():
    """botocore's BaseClient._make_api_call with none of mtrl's layers; the process's layers put back after."""
    import botocore.client

    from mtrl_adapters._bedrock import REDIRECT
    from mtrl_adapters._selective import BEDROCK_PATCH

    before = PATCHES.layers_on(botocore.client.BaseClient, "_make_api_call")
    PATCHES.uninstall(BEDROCK_PATCH)
    PATCHES.uninstall(REDIRECT)
    assert PATCHES.layers_on(botocore.client.BaseClient, "_make_api_call") == ()
    yield botocore.client.BaseClient, {"selective": BEDROCK_PATCH, "redirect": REDIRECT}
    for name in before:
        PATCHES.install({"selective": BEDROCK_PATCH, "redirect": REDIRECT}[name])


def _converse(client: Any, model: str) -> dict:
    from botocore.stub import Stubber

    stubber = Stubber(client)
    stubber.add_response("converse", {
        "output": {"message": {"role": "assistant", "content": [{"text": "fine"}]}}, "stopReason": "end_turn",
        "usage": {"inputTokens": 7, "outputTokens": 2, "totalTokens": 9}, "metrics": {"latencyMs": 1},
    })
    with stubber:
        return client.converse(modelId=model, messages=[{"role": "user", "content": [{"text": "judge this"}]}])


def _judge_call_attaches_the_redirect() -> tuple[bool, list]:
    """A judge's Converse call (not a policy model) inside a rollout: whether its client got the redirect's
    handlers (the redirect saw the rollout) and what the rollout recorded."""
    import botocore.session

    client = botocore.session.get_session().create_client(
        "bedrock-runtime", region_name="us-east-1", aws_access_key_id="AKIDUSER", aws_secret_access_key="user")
    ctx = RolloutContext(rollout_id="r-order", token="t", endpoint="http://127.0.0.1:9",
                         policy_models=frozenset({"policy"}))
    with rollout_scope(ctx):
        assert _converse(client, "judge")["output"]["message"]["content"] == [{"text": "fine"}]
    return bool(getattr(client, "_mtrl_bedrock_redirect", False)), ctx.take_model_calls()


@pytest.mark.parametrize("first", ["redirect", "selective"])
def test_botocore_make_api_call_layers_are_selective_then_redirect(bare_botocore, first):
    """``instrument()`` used to nest the two in the order it called them; the set's order decides now."""
    base, layer = bare_botocore
    original = base._make_api_call
    second = "selective" if first == "redirect" else "redirect"
    assert PATCHES.install(layer[first]) is True and PATCHES.install(layer[second]) is True
    assert PATCHES.layers_on(base, "_make_api_call") == ("selective", "redirect")
    assert base._make_api_call.__mtrl_original__ is original  # one wrapper over botocore's own method
    attached, calls = _judge_call_attaches_the_redirect()
    assert attached is False  # selective ran first: the judge's call reached the redirect with no rollout
    assert [(c.model, c.input_tokens, c.output_tokens, c.status) for c in calls] == [("judge", 7, 2, "success")]


def test_the_order_check_can_fail(bare_botocore):
    """The same two layers under a set declared the other way round: the redirect sees the judge's call."""
    base, layer = bare_botocore
    reversed_set = PatchSet(("redirect", "selective"))
    reversed_set.install(layer["selective"])
    reversed_set.install(layer["redirect"])
    try:
        assert reversed_set.layers_on(base, "_make_api_call") == ("redirect", "selective")
        attached, calls = _judge_call_attaches_the_redirect()
        assert attached is True and len(calls) == 1
    finally:
        reversed_set.uninstall(layer["redirect"])
        reversed_set.uninstall(layer["selective"])


# ---------------------------------------------------------------------- uninstall
def test_uninstall_restores_the_original_itself():
    owner, trace, patches = make_owner(), [], PatchSet(LAYERS)
    original = owner.__dict__["call"]
    inner, outer = (Patch(owner, "call", n, tracing(n, trace)) for n in ("inner", "outer"))
    patches.install(inner)
    patches.install(outer)
    assert patches.uninstall(outer) is True and patches.layers_on(owner, "call") == ("inner",)
    assert getattr(owner.call, ORIGINAL) is original  # rebuilt over the same original
    assert patches.uninstall(inner) is True and owner.__dict__["call"] is original
    assert patches.uninstall(inner) is False and owner.__dict__["call"] is original
    trace.clear()
    assert owner().call(1) == 2 and trace == []


def test_uninstall_of_an_inherited_method_leaves_no_own_attribute():
    base = make_owner()
    sub = type("Sub", (base,), {})
    patches = PatchSet(LAYERS)
    patch = Patch(sub, "call", "inner", tracing("inner", []))
    patches.install(patch)
    assert "call" in sub.__dict__ and base.__dict__["call"] is getattr(sub.call, ORIGINAL)
    patches.uninstall(patch)
    assert "call" not in sub.__dict__ and sub.call is base.call


def test_uninstall_restores_botocore_and_strands_originals(bare_botocore):
    base, layer = bare_botocore
    original = base.__dict__["_make_api_call"]
    PATCHES.install(layer["redirect"])
    PATCHES.install(layer["selective"])
    PATCHES.uninstall(layer["redirect"])
    assert PATCHES.layers_on(base, "_make_api_call") == ("selective",)
    PATCHES.uninstall(layer["selective"])
    assert base.__dict__["_make_api_call"] is original

    pytest.importorskip("strands")
    from strands import Agent

    from mtrl_adapters.strands import instrument_strands, uninstall_strands

    instrument_strands()
    own = Agent.__init__.__mtrl_original__
    assert uninstall_strands() is True and Agent.__dict__["__init__"] is own
    assert instrument_strands() is True


# ---------------------------------------------------------------------- threads
def test_concurrent_installs_from_threads_install_each_layer_once():
    owner, trace, patches = make_owner(), [], PatchSet(LAYERS)
    declared = [Patch(owner, "call", n, tracing(n, trace)) for n in LAYERS]
    threads, barrier, results = 24, threading.Barrier(24), []
    lock = threading.Lock()

    def race(i: int) -> None:
        patch = declared[i % len(declared)]
        barrier.wait()
        installed = patches.install(patch)
        with lock:
            results.append((patch.layer, installed))

    workers = [threading.Thread(target=race, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(name for name, installed in results if installed) == sorted(LAYERS)  # each exactly once
    assert len(results) == threads
    assert owner().call(1) == 2 and trace == ["outer", "middle", "inner"]


def test_concurrent_instrument_calls_leave_one_ordered_wrapper(bare_botocore):
    from mtrl_adapters import instrument_bedrock
    from mtrl_adapters._selective import instrument_selective

    base, _ = bare_botocore
    barrier, results = threading.Barrier(8), []

    def race(i: int) -> None:
        barrier.wait()
        results.append(instrument_bedrock() if i % 2 else "bedrock" in instrument_selective())

    workers = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert results.count(True) == 2  # one redirect, one selective layer
    assert PATCHES.layers_on(base, "_make_api_call") == ("selective", "redirect")


# ---------------------------------------------------------------------- errors
def test_a_missing_target_is_named():
    with pytest.raises(PatchTargetMissing, match=r"botocore\.client\.BaseClient\._make_api_kall") as err:
        PATCHES.install(Patch("botocore.client:BaseClient", "_make_api_kall", "redirect", tracing("x", [])))
    assert "'redirect'" in str(err.value) and "has no attribute '_make_api_kall'" in str(err.value)
    with pytest.raises(PatchTargetMissing, match=r"module 'no_such_sdk\._base_client' cannot be imported"):
        PATCHES.install(Patch("no_such_sdk._base_client:BaseClient", "_build_request", "redirect", tracing("x", [])))
    with pytest.raises(PatchTargetMissing, match=r"botocore\.client\.NoClient\.call.*has no 'NoClient'"):
        PATCHES.install(Patch("botocore.client:NoClient", "call", "redirect", tracing("x", [])))
    with pytest.raises(PatchTargetMissing, match=r"botocore\.client\.no_function: botocore\.client has no attribute"):
        PATCHES.install(Patch("botocore.client", "no_function", "redirect", tracing("x", [])))  # a module's function
    optional = Patch("botocore.client:BaseClient", "_make_api_kall", "redirect", tracing("x", []), required=False)
    assert PATCHES.install(optional) is False  # an optional method (a LiteLLM version without it) is skipped


def test_bad_declarations_are_refused_naming_the_value():
    owner = make_owner()
    with pytest.raises(ValueError, match=r"Patch.owner .* not 'botocore.client:'"):
        Patch("botocore.client:", "_make_api_call", "redirect", tracing("x", []))
    with pytest.raises(TypeError, match=r"Patch.owner .* not 3"):
        Patch(3, "_make_api_call", "redirect", tracing("x", []))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Patch.attribute .* not 'make api call'"):
        Patch(owner, "make api call", "redirect", tracing("x", []))
    with pytest.raises(ValueError, match=r"Patch.layer 'sideways' .* layers \('outer', 'middle', 'inner'\)"):
        PatchSet(LAYERS).install(Patch(owner, "call", "sideways", tracing("x", [])))
    with pytest.raises(ValueError, match="distinct"):
        PatchSet(("a", "a"))
    with pytest.raises(TypeError, match=r"the 'outer' wrap of .*Owner\.call returned"):
        PatchSet(LAYERS).install(Patch(owner, "call", "outer", lambda original: original))
    assert "call" in owner.__dict__ and not hasattr(owner.call, MARK)  # a refused install leaves nothing


def test_one_wrapper_per_layer_and_one_set_per_method():
    owner, patches = make_owner(), PatchSet(LAYERS)
    patches.install(Patch(owner, "call", "inner", tracing("a", [])))
    with pytest.raises(ValueError, match="already holds a different 'inner' layer"):
        patches.install(Patch(owner, "call", "inner", tracing("b", [])))
    with pytest.raises(RuntimeError, match="patched by another PatchSet"):
        PatchSet(LAYERS).install(Patch(owner, "call", "outer", tracing("c", [])))


def test_a_foreign_wrapper_over_ours_is_not_silently_dropped():
    owner, trace, patches = make_owner(), [], PatchSet(LAYERS)
    inner = Patch(owner, "call", "inner", tracing("inner", trace))
    patches.install(inner)
    ours = owner.call

    @functools.wraps(ours)  # copies our mark onto the other library's wrapper
    def theirs(self: Any, x: int) -> int:
        trace.append("theirs")
        return ours(self, x)

    owner.call = theirs
    assert patches.install(inner) is False and owner.call is theirs  # in effect already, under theirs
    with pytest.raises(RuntimeError, match=r"another library wrapped that method over mtrl's own wrapper"):
        patches.install(Patch(owner, "call", "outer", tracing("outer", trace)))
    assert owner.call is theirs and owner().call(1) == 2 and trace == ["theirs", "inner"]


def test_aiobotocore_gets_the_same_two_layers_in_the_same_order():
    pytest.importorskip("aiobotocore.client", reason="aiobotocore is not installed (it pins an older botocore)")
    from aiobotocore.client import AioBaseClient

    from mtrl_adapters._aiobotocore import PATCHES_AIO, instrument_aiobotocore

    instrument_aiobotocore()
    assert PATCHES.layers_on(AioBaseClient, "_make_api_call") == ("selective", "redirect")
    original = AioBaseClient._make_api_call.__mtrl_original__
    for patch in PATCHES_AIO:
        PATCHES.uninstall(patch)
    assert AioBaseClient.__dict__["_make_api_call"] is original
    assert instrument_aiobotocore() is True and instrument_aiobotocore() is False


def test_a_classmethod_and_a_module_function_are_wrapped_and_put_back_as_they_were():
    import types

    trace: list[str] = []

    class Util:
        @classmethod
        def invoke(cls, x: int) -> str:
            return f"{cls.__name__}:{x}"

    module = types.ModuleType("mtrl_test_module")
    exec("def build(x):\n    return x * 2\n", module.__dict__)
    own_classmethod, own_function = Util.__dict__["invoke"], module.build
    patches = PatchSet(LAYERS)

    def noting(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any) -> Any:
            trace.append(original.__name__)
            return original(*args)

        return wrapper

    on_class, on_module = Patch(Util, "invoke", "inner", noting), Patch(module, "build", "inner", noting)
    assert patches.install(on_class) and patches.install(on_module)
    assert isinstance(Util.__dict__["invoke"], classmethod) and patches.install(on_class) is False
    assert Util.invoke(3) == "Util:3" and module.build(3) == 6 and trace == ["invoke", "build"]
    assert patches.layers_on(Util, "invoke") == ("inner",) and patches.layers_on(module, "build") == ("inner",)
    assert patches.uninstall(on_class) and patches.uninstall(on_module)
    assert Util.__dict__["invoke"] is own_classmethod and module.build is own_function


def test_installing_while_another_thread_imports_the_target_waits_for_that_import(tmp_path, monkeypatch):
    """16 threads' first rollouts: one imports ``botocore.client`` while another installs on it. The install must
    wait for the import (its lock), not read the half-made module from ``sys.modules`` and call the class missing."""
    import importlib
    import sys
    import time

    (tmp_path / "mtrl_slow_sdk.py").write_text(
        "import time\ntime.sleep(0.6)\n\nclass Client:\n    def call(self, x):\n        return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mtrl_slow_sdk", raising=False)
    importer = threading.Thread(target=importlib.import_module, args=("mtrl_slow_sdk",))
    importer.start()
    while "mtrl_slow_sdk" not in sys.modules:  # the import has begun: the module is there, half made
        time.sleep(0.01)
    trace: list[str] = []
    patches = PatchSet(LAYERS)
    assert patches.install(Patch("mtrl_slow_sdk:Client", "call", "inner", tracing("inner", trace))) is True
    importer.join()
    assert sys.modules["mtrl_slow_sdk"].Client().call(1) == 2 and trace == ["inner"]


def test_google_genai_gets_its_redirect_and_four_selective_layers_once():
    pytest.importorskip("google.genai", reason="google-genai is not installed (the gemini extra)")
    from google.genai._api_client import BaseApiClient

    from mtrl_adapters import instrument_gemini
    from mtrl_adapters._gemini import PATCHES_GEMINI

    instrument_gemini()
    assert instrument_gemini() is False
    assert PATCHES.layers_on(BaseApiClient, "_build_request") == ("redirect",)
    for name in ("request", "async_request", "request_streamed", "async_request_streamed"):
        assert PATCHES.layers_on(BaseApiClient, name) == ("selective",), name
    originals = {p.attribute: getattr(BaseApiClient, p.attribute).__mtrl_original__ for p in PATCHES_GEMINI}
    for patch in PATCHES_GEMINI:
        assert PATCHES.uninstall(patch) is True
    assert all(BaseApiClient.__dict__[name] is original for name, original in originals.items())
    assert instrument_gemini() is True
