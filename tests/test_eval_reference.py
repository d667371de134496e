"""The evaluator's reference side: the same agent, tasks and seeds on a reference model behind its own endpoint.

The reference is a second real coordinator on 127.0.0.1 (inference mode,
an API key required) whose scripted engine solves the task: it looks the
value up with the ``lookup`` tool, then answers ``ANSWER 42``. The
evaluated policy is a scripted engine that always answers ``ANSWER 7``.
The agent is a plain OpenAI-client tool loop (``_eval_agents``); its calls
reach the evaluating coordinator, which passes the reference side's on to
the reference endpoint and records them in the evaluation's SQLite store.
The same reference coordinator also serves Anthropic Messages and Bedrock
Converse, so the reference wires of those protocols run against it too.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

import _eval_agents as agents
from _run_stop import stop_while_in_flight
from mtrl_runtime.algorithms import NoTokenIds, build_samples
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.coordinator._reference import ReferenceClient
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.evaluation import BASE, REFERENCE, MultiTurnRLEvaluator, ReferenceModel, sample_seed
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.errors import Conflict
from mtrl_runtime.testing import free_port
from mtrl_runtime.types import GenerationRequest, RolloutStatus, SamplingParams, Task

KEY_ENV = "MTRL_TEST_REFERENCE_KEY"
KEY = "sk-reference-test"
TASKS = [{"id": f"t-{n}", "prompt": f"task {n}: what is the value of A1?", "ground_truth": 42, "split": "test"}
         for n in range(3)]
SAMPLES = 2


def config(tmp_path: Path) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"run_dir": str(tmp_path / "run"), "pass_k_values": [1, 2], "max_turns": 3,
                 "val_sampling_params": {"temperature": 0.7, "max_tokens": 48}},
        "advanced": {"rollout_timeout_s": 30},
    })


class Solver:
    """The reference's script: look A1 up, then answer from the tool's result. Logs each call's seed and prompt."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, str]] = []
        self.delay_s = 0.0  # how long each answer takes

    def __call__(self, request: GenerationRequest, prompt: str) -> Any:
        self.calls.append((request.sampling.seed, prompt))
        if "<tool_response>" in prompt:
            return ScriptedReply.plain("ANSWER 42", delay_s=self.delay_s)
        return ScriptedReply.tool_call("lookup", {"key": "A1"}, delay_s=self.delay_s)


class Failing:
    """The policy's script: a wrong answer at once. Logs the seed of each rollout."""

    def __init__(self) -> None:
        self.seeds: dict[str, int | None] = {}

    def __call__(self, request: GenerationRequest, prompt: str) -> Any:
        self.seeds[request.rollout_id] = request.sampling.seed
        return "ANSWER 7"


@pytest.fixture
def reference(served, tiny_tok, monkeypatch) -> Any:
    """A second coordinator serving the solver, calls without a rollout allowed with the API key ``KEY``."""
    solver = Solver()
    cfg = MtrlConfig.from_dict({"core": {"model": "solver-1"},
                                "advanced": {"server": {"inference_mode": True, "api_key": KEY}}})
    handle = served(ScriptedEngine(tiny_tok, solver), cfg)
    handle.solver = solver
    monkeypatch.setenv(KEY_ENV, KEY)
    return handle


def test_reference_side_beats_base_on_the_same_tasks_and_seeds_recorded_and_never_trained(
        tmp_path, tiny_tok, reference):
    policy = Failing()
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS, config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, policy), strict_scorer=agents.strict_answer, max_samples=SAMPLES,
        tracking=False, reference={"url": reference.url + "/v1", "model": "solver-1", "api_key_env": KEY_ENV},
    )
    result = evaluator.evaluate()

    assert list(result.sides) == [BASE, REFERENCE]
    base, ref = result.base.metrics, result.reference.metrics
    assert base["val/reward/success_rate"] == 0.0 and base["val/strict/success_rate"] == 0.0
    assert ref["val/reward/success_rate"] == 1.0 and ref["val/strict/success_rate"] == 1.0
    assert ref["val/tool_calls/lookup_frac"] == 1.0 and ref["val/completed_frac"] == 1.0
    assert "val/template_drift_frac" in base and "val/template_drift_frac" not in ref  # no ids to compare
    assert result.metrics["val/reward/mean"] == 0.0  # the evaluated model (base: no fine-tuned side)
    assert result.metrics["reference/val/reward/mean"] == 1.0 and "base/val/reward/mean" not in result.metrics

    # the same tasks and seeds on each side: each rollout's first call carries its sample's seed
    expected = sorted(sample_seed(0, t["id"], j) for t in TASKS for j in range(SAMPLES))
    assert sorted(policy.seeds.values()) == expected
    first_calls = [seed for seed, prompt in reference.solver.calls if "<tool_response>" not in prompt]
    assert sorted(first_calls) == expected
    assert len(reference.solver.calls) == 2 * len(expected)  # lookup, then the answer
    assert sorted(r.task_id for r in result.base.rollouts) == sorted(r.task_id for r in result.reference.rollouts)

    # the report: base and reference side by side, the reference named
    report = json.loads(result.report.json.read_text())
    assert report["models"][REFERENCE]["model"] == "solver-1" and report["models"][BASE]["model"] is None
    assert report["models"][REFERENCE]["per_task"]["t-0"] == {"samples": 2, "successes": 2, "mean_reward": 1.0}
    markdown = result.report.markdown.read_text()
    assert "| metric | base | reference |" in markdown and "| success rate | 0.000 | 1.000 |" in markdown
    assert "reference model `solver-1`" in markdown
    assert result.report.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # recorded in the evaluation's store: the reference's turns name their model, hold no ids, train nothing
    with SQLiteStore(result.output_path / "trajectories.db") as store:
        stored = [store.get_rollout(r.id) for r in result.reference.rollouts]
        base_stored = store.get_rollout(result.base.rollouts[0].id)
    assert len(stored) == len(expected)
    for rollout in stored:
        assert rollout.step is None and "-ref-" in rollout.group_id
        assert [t.model for t in rollout.turns] == ["solver-1", "solver-1"]
        assert all(t.prompt_ids == () and t.completion_ids == () and t.logprobs == () for t in rollout.turns)
        assert rollout.turns[0].tool_calls[0]["function"]["name"] == "lookup"
        assert rollout.turns[1].completion_text == "ANSWER 42" and rollout.reward == 1.0
        assert rollout.turns[1].messages[-1] == {"role": "tool", "tool_call_id": rollout.turns[0].tool_calls[0]["id"],
                                                 "content": "42"}  # the conversation, as the reference saw it
        with pytest.raises(NoTokenIds, match=r"reference model 'solver-1'.*no token ids"):
            build_samples(rollout, [1.0, 1.0])
    assert base_stored.turns[0].model is None and base_stored.turns[0].prompt_ids  # the policy's: ids, trainable
    assert build_samples(base_stored, [1.0])


def test_a_stop_ends_a_reference_rollout_at_once_without_waiting_for_the_endpoint(tmp_path, tiny_tok, reference):
    """The run stops while a reference-side call waits for a slow endpoint (a teacher taking minutes): the
    rollout ends ``interrupted`` at once and the call is refused naming the stop, as a policy call's generation
    is; before, the end waited for the endpoint's answer."""
    reference.solver.delay_s = 20.0
    store = SQLiteStore(tmp_path / "eval.db")
    coordinator = Coordinator(ScriptedEngine(tiny_tok, Failing()), store, config(tmp_path))
    model = ReferenceModel(url=reference.url + "/v1", model="solver-1")

    async def stop_while_the_reference_answers() -> tuple[float, BaseException | None, str]:
        async with coordinator.reference_side(model, api_key=KEY):
            handle = coordinator.create_rollout(Task("t-0", prompt=TASKS[0]["prompt"], ground_truth=42))
            call = coordinator.chat(handle.rollout_id, handle.token, [{"role": "user", "content": TASKS[0]["prompt"]}],
                                    None, SamplingParams(max_tokens=16))
            # reached: the call is at the reference endpoint, which now waits
            took, refused = await stop_while_in_flight(coordinator, handle.rollout_id, call,
                                                       lambda: bool(reference.solver.calls))
            return took, refused, handle.rollout_id

    try:
        took, refused, rollout_id = asyncio.run(stop_while_the_reference_answers())
        stored = coordinator.recorded(rollout_id)
    finally:
        store.close()
    assert took < 5.0, f"the stop waited {took:.1f} s for the reference's answer"
    assert isinstance(refused, Conflict) and "the run stopped" in str(refused), repr(refused)
    assert stored.status is RolloutStatus.INTERRUPTED and stored.turns == ()
    assert coordinator.counters.reference_turns == 0


def test_an_anthropic_messages_reference(tmp_path, tiny_tok, reference):
    """The reference speaks Anthropic Messages (here mtrl's own /v1/messages, key in x-api-key); the agent OpenAI."""
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS[:2], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), strict_scorer=agents.strict_answer, max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url, model="solver-1", api_key_env=KEY_ENV, protocol="anthropic"),
    )
    result = evaluator.evaluate()
    assert result.reference.metrics["val/strict/success_rate"] == 1.0
    assert result.base.metrics["val/strict/success_rate"] == 0.0
    for rollout in result.reference.rollouts:
        assert [t.model for t in rollout.turns] == ["solver-1", "solver-1"]
        call = rollout.turns[0].tool_calls[0]
        assert call["function"] == {"name": "lookup", "arguments": '{"key": "A1"}'} and call["id"]
    # the reference saw the tool's result: its second call rendered it (the policy's format, on its side)
    assert sum("<tool_response>" in prompt for _, prompt in reference.solver.calls) == 2


def test_an_openai_responses_reference(tmp_path, tiny_tok, reference):
    """The reference speaks OpenAI Responses (here mtrl's own /v1/responses, store false); the agent OpenAI chat."""
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS[:2], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), strict_scorer=agents.strict_answer, max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url + "/v1", model="solver-1", api_key_env=KEY_ENV,
                                 protocol="responses"),
    )
    result = evaluator.evaluate()
    assert result.reference.metrics["val/strict/success_rate"] == 1.0
    assert result.base.metrics["val/strict/success_rate"] == 0.0
    for rollout in result.reference.rollouts:
        assert [t.model for t in rollout.turns] == ["solver-1", "solver-1"]
        call = rollout.turns[0].tool_calls[0]
        assert call["function"] == {"name": "lookup", "arguments": '{"key": "A1"}'} and call["id"]
    # the reference saw the tool's result: its second call rendered it (the policy's format, on its side)
    assert sum("<tool_response>" in prompt for _, prompt in reference.solver.calls) == 2


def test_a_bedrock_converse_reference_with_an_api_key(tmp_path, tiny_tok, reference):
    """The reference speaks Bedrock Converse (mtrl's own /model/{id}/converse), a Bedrock API key as Bearer."""
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS[:2], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), strict_scorer=agents.strict_answer, max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url, model="us.solver-1:0", api_key_env=KEY_ENV, protocol="bedrock"),
    )
    result = evaluator.evaluate()
    assert result.reference.metrics["val/strict/success_rate"] == 1.0
    assert result.base.metrics["val/strict/success_rate"] == 0.0
    assert {t.model for r in result.reference.rollouts for t in r.turns} == {"us.solver-1:0"}
    assert sum("<tool_response>" in prompt for _, prompt in reference.solver.calls) == 2


def test_a_bedrock_reference_without_a_key_is_signed_with_aws_credentials(monkeypatch):
    from mtrl_runtime.coordinator import ReferenceModel as Model

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    reference = Model(url="https://bedrock-runtime.us-west-2.amazonaws.com", model="anthropic.claude:0",
                      protocol="bedrock")
    wire = reference.wire
    url = wire.chat_url(reference.url, reference.model)
    assert url == "https://bedrock-runtime.us-west-2.amazonaws.com/model/anthropic.claude%3A0/converse"
    headers = wire.headers(None, "POST", url, b"{}")
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-west-2/bedrock/aws4_request" in headers["Authorization"] and "X-Amz-Date" in headers


def streaming_agent() -> Any:
    """The tool loop of ``_eval_agents`` with streamed calls (``stream=True``, the chunks gathered by hand)."""
    import openai

    from mtrl_adapters import aupdate_reward, rollout

    specs = agents.tool_specs(["lookup"])

    @rollout
    async def agent(task: Any) -> None:
        client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        for _ in range(3):
            content, calls = "", {}
            async for chunk in await client.chat.completions.create(model="policy", messages=messages, tools=specs,
                                                                    stream=True):
                delta = chunk.choices[0].delta if chunk.choices else None
                content += (delta.content or "") if delta else ""
                for call in (delta.tool_calls or []) if delta else []:
                    calls.setdefault(call.index, call.model_dump())
            messages.append({"role": "assistant", "content": content,
                             **({"tool_calls": list(calls.values())} if calls else {})})
            if not calls:
                break
            for call in calls.values():
                result = agents.FUNCTIONS[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
        await aupdate_reward(*agents.answer_score(messages[-1]["content"] or "", task))

    return agent


def test_a_streamed_call_gets_the_reference_reply_whole(tmp_path, tiny_tok, reference):
    evaluator = MultiTurnRLEvaluator(
        agent_env=streaming_agent(), dataset=TASKS[:1], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url + "/v1", model="solver-1", api_key_env=KEY_ENV),
    )
    result = evaluator.evaluate()
    assert result.reference.metrics["val/reward/success_rate"] == 1.0  # "ANSWER 42" reached the agent, streamed
    assert result.base.metrics["val/reward/success_rate"] == 0.0


def test_mlflow_holds_the_reference_metrics_and_traces_its_disputed_trajectories(tmp_path, tiny_tok, reference):
    """``reference/val/...`` beside ``val/...``; a disputed reference trajectory's trace names its model."""
    import mlflow
    from mlflow import MlflowClient

    never = lambda text, ground_truth: 0.0  # noqa: E731 (a strict scorer that disputes every success)
    result = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS[:1], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), strict_scorer=never, max_samples=1,
        reference=ReferenceModel(url=reference.url + "/v1", model="solver-1", api_key_env=KEY_ENV),
    ).evaluate()
    client = MlflowClient(tracking_uri=result.tracking_uri)
    logged = client.get_run(result.mlflow_run_id).data.metrics
    assert logged["reference/val/reward/mean"] == 1.0 and logged["val/reward/mean"] == 0.0
    assert logged["reference/val/strict/reward_only_frac"] == 1.0
    mlflow.set_tracking_uri(result.tracking_uri)
    run = client.get_run(result.mlflow_run_id)
    (trace,) = mlflow.search_traces(locations=[run.info.experiment_id], return_type="list", flush=True)
    llm = [s for s in trace.data.spans if s.name.startswith("llm turn")]
    assert [s.attributes["mtrl.model"] for s in llm] == ["solver-1", "solver-1"]
    assert {s.attributes["mtrl.prompt_tokens"] for s in llm} == {0}  # no ids from a closed endpoint


def test_a_reference_call_asking_for_token_ids_is_refused_before_it_leaves(tmp_path, tiny_tok, reference):
    import openai

    from mtrl_adapters import aupdate_reward, rollout

    errors: list[str] = []

    @rollout
    async def agent(task: Any) -> None:
        client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
        try:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}],
                                                 logprobs=True)
        except openai.BadRequestError as exc:
            errors.append(str(exc))
        await aupdate_reward(0.0)

    result = MultiTurnRLEvaluator(
        agent_env=agent, dataset=TASKS[:1], config=config(tmp_path), engine=ScriptedEngine(tiny_tok, Failing()),
        max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url + "/v1", model="solver-1", api_key_env=KEY_ENV),
    ).evaluate()
    (message,) = errors  # the base side's call got its logprobs; the reference side's was refused
    assert "reference model 'solver-1'" in message and "no token ids or logprobs" in message
    assert reference.solver.calls == [] and result.reference.rollouts[0].turns == ()


def test_unreachable_reference_fails_at_once_naming_the_url(tmp_path, tiny_tok):
    url = f"http://127.0.0.1:{free_port()}/v1"  # a port nothing listens on
    policy = Failing()
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS * 1, config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, policy), max_samples=SAMPLES, tracking=False,
        reference=ReferenceModel(url=url, model="frontier"), output_path=tmp_path / "eval",
    )
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=re.escape(f"cannot reach {url}")):
        evaluator.evaluate()
    assert time.monotonic() - started < 15
    assert policy.seeds == {} and not (tmp_path / "eval" / "trajectories.db").exists()  # nothing ran


def test_reference_key_is_forwarded_and_a_missing_key_variable_is_named(tmp_path, tiny_tok, reference, monkeypatch):
    model = ReferenceModel(url=reference.url + "/v1", model="solver-1", api_key_env=KEY_ENV)
    assert model.api_key() == KEY
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match=f"environment variable {KEY_ENV} is not set"):
        model.api_key()
    # the key reached the reference: without it, its inference calls are refused and every reference rollout fails
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS[:1], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url + "/v1", model="solver-1"),
    )
    result = evaluator.evaluate()
    (failed,) = result.reference.rollouts
    assert failed.status.value == "failed" and "HTTP 401" in (failed.error or "")
    assert reference.solver.calls == []


def test_the_reference_clients_calls_share_one_tls_context(reference, monkeypatch):
    """A client per call (each may run on another event loop), and httpx builds a verified TLS context (~20 ms of
    CPU) for each: the reference client's take the process's one (``mtrl_runtime.tls``), built once at most."""
    built: list[int] = []
    make = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or make(*a, **k))
    client = ReferenceClient(ReferenceModel(url=reference.url + "/v1", model="solver-1", api_key_env=KEY_ENV), KEY)

    async def three_calls() -> None:
        for _ in range(3):
            await client.check()

    asyncio.run(three_calls())
    assert len(built) <= 1, f"{len(built)} TLS contexts built for 3 calls to the reference"


@pytest.mark.parametrize("given, fragment", [
    ({"url": "ftp://models.example/v1", "model": "m"}, "reference url: expected an http(s) base URL"),
    ({"url": "http://127.0.0.1:1/v1", "model": " "}, "reference model: expected the reference model's name"),
    ({"url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": "not a name"}, "reference api_key_env"),
    ({"url": "http://127.0.0.1:1/v1", "model": "m", "key": "sk"}, "unknown key(s) 'key'"),
])
def test_bad_reference_settings_are_named(given, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        ReferenceModel.coerce(given)


def write_cli_inputs(tmp_path: Path, model_dir: Path) -> list[str]:
    import yaml

    cfg = {"core": {"engine": "scripted", "model": str(model_dir), "run_dir": str(tmp_path / "run"),
                    "pass_k_values": [1], "max_turns": 3},
           "advanced": {"engine_options": {"script": ["ANSWER 7"]}, "rollout_timeout_s": 30}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS[:2]))
    return [str(tmp_path / "cfg.yaml"), "--agent", "_eval_agents:agent", "--dataset", str(tmp_path / "tasks.jsonl")]


@pytest.mark.parametrize("flags, message", [
    (["--reference-url", "http://127.0.0.1:1/v1"], "--reference-url needs --reference-model too"),
    (["--reference-model", "m"], "--reference-model needs --reference-url too"),
    (["--reference-api-key-env", KEY_ENV], "--reference-api-key-env needs --reference-url and --reference-model"),
    (["--reference-url", "localhost:8000", "--reference-model", "m"], "--reference-url: reference url: expected"),
    (["--reference-url", "http://127.0.0.1:1/v1", "--reference-model", "m", "--reference-api-key-env",
      "MTRL_TEST_UNSET_VARIABLE"], "--reference-api-key-env: reference api_key_env: the environment variable "
                                   "MTRL_TEST_UNSET_VARIABLE is not set"),
])
def test_cli_bad_reference_flags_are_named(tmp_path, flags, message, monkeypatch):
    from mtrl_runtime.cli import main

    monkeypatch.delenv("MTRL_TEST_UNSET_VARIABLE", raising=False)
    with pytest.raises(SystemExit, match=re.escape(message)):  # before a model loads: none is needed to refuse
        main(["eval", *write_cli_inputs(tmp_path, tmp_path / "no-model"), "--no-mlflow", *flags])


def test_cli_protocol_choices_are_the_reference_wires():
    from mtrl_runtime.cli.eval import REFERENCE_PROTOCOLS
    from mtrl_runtime.coordinator._reference import REFERENCE_WIRES as WIRES

    assert sorted(REFERENCE_PROTOCOLS) == WIRES.names()


def test_cli_eval_with_a_reference(tmp_path, tiny_model_dir, reference, capsys):
    from mtrl_runtime.cli import main

    common = write_cli_inputs(tmp_path, tiny_model_dir)
    assert main(["eval", *common, "--strict", "_eval_agents:strict_answer", "--no-mlflow",
                 "--reference-url", reference.url + "/v1", "--reference-model", "solver-1",
                 "--reference-api-key-env", KEY_ENV]) == 0
    out = capsys.readouterr().out
    assert re.search(r"val/strict/success_rate\s+0\.000\s+1\.000", out), out
    report = json.loads((tmp_path / "run" / "eval" / "report" / "eval_report.json").read_text())
    assert set(report["models"]) == {BASE, REFERENCE} and report["models"][REFERENCE]["model"] == "solver-1"
    assert KEY not in (tmp_path / "run" / "eval" / "report" / "eval_report.json").read_text()

    # an unreachable reference: exit 2 at once, naming the URL, before any rollout
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["eval", *common, "--no-mlflow", "--output", str(tmp_path / "second"),
                 "--reference-url", url, "--reference-model", "solver-1"]) == 2
    assert f"cannot reach {url}" in capsys.readouterr().err
    assert not (tmp_path / "second" / "trajectories.db").exists()
