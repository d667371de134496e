"""Warm start (``mtrl sft``): rendering, the OpenAI JSONL and store sources, the SFT step, ``mtrl train`` from its adapter.

Everything runs for real: a plain OpenAI-client ``@rollout`` agent calls
``lookup`` through the served endpoint (scripted engine, tiny tokenizer),
its rollouts are recorded in SQLite, conversations go through JSONL files,
and the SFT step and the RL runs train a tiny Llama built in the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from _groups import one_worker
from mtrl_runtime.algorithms import LOSSES, LossParams
from mtrl_runtime.algorithms.samples import build_samples
from mtrl_runtime.cli import main
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.evaluation import StrictScorer
from mtrl_runtime.rewards import trajectory_of
from mtrl_runtime.rollouts import collect_rollouts
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer
from mtrl_runtime.tracking import flatten_params
from mtrl_runtime.training import (
    MultiTurnRLTrainer, PolicyUpdate, UpdateSettings, build_policy, load_initial_weights, policy_from_config,
)
from mtrl_runtime.types import Task
from mtrl_runtime.warmstart import (
    Conversation, SftSettings, conversation_demonstrations, conversation_renderer, importer, render_conversation,
    select_rollouts, sft, store_demonstrations,
)

pytestmark = one_worker(__name__)  # the collected rollouts and the trained SFT run, built once

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "The value stored under a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
TABLE = {"A1": "42"}
EXACT, LENIENT, WRONG = "ANSWER 42", "so ANSWER 42 maybe", "ANSWER 7"


# -- the agent and its script ---------------------------------------------------------------------------------


def lenient_reward(text: str) -> float:
    return float("42" in text)


def strict_exact(text: str, ground_truth: Any) -> float:
    return float(text.strip() == f"ANSWER {ground_truth}")


def make_agent() -> Any:
    """Chat with ``lookup`` offered until a reply calls no tool; each call recorded; reward ``lenient_reward``."""
    import openai

    from mtrl_adapters import aupdate_reward, record_tool_call, rollout

    clients: dict[int, Any] = {}

    @rollout
    async def agent(task: Any) -> None:
        loop = id(asyncio.get_running_loop())
        client = clients.setdefault(loop, openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused",
                                                              max_retries=0))
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        while True:
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP])
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                result = TABLE.get(arguments.get("key"), "none")
                record_tool_call(call.function.name, arguments, result=result, call_id=call.id)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        await aupdate_reward(lenient_reward(message.content or ""))

    return agent


class Script:
    """Turn 0 calls ``lookup(A1)`` in format ``fmt``; turn 1 answers by the rollout's rank within its task:
    the first rollout of a task answers EXACT, the second LENIENT, the third WRONG."""

    def __init__(self, fmt: str = "hermes") -> None:
        self.fmt = fmt
        self.rank: dict[str, int] = {}
        self.seen: Counter[str] = Counter()

    def __call__(self, request: Any, prompt: str) -> str:
        if request.turn_index == 0:
            task = prompt.rsplit("question ", 1)[1][:2]
            self.rank[request.rollout_id] = self.seen[task]
            self.seen[task] += 1
            return call_text(self.fmt, [("lookup", {"key": "A1"})])
        return answer_text(self.fmt, (EXACT, LENIENT, WRONG)[self.rank[request.rollout_id] % 3])


TASKS = [Task(id=f"task-{n}", prompt=f"Look A1 up. question q{n}?", ground_truth=42) for n in range(4)]


def collect(run_dir: Path, tokenizer: Any, fmt: str | None = None, tasks: list[Task] = TASKS, group_size: int = 3):
    config = MtrlConfig.from_dict({"core": {"run_dir": str(run_dir), "group_size": group_size, "engine": "scripted"},
                                   "advanced": {"chat_format": fmt, "max_concurrency": 4}})
    engine = ScriptedEngine(tokenizer, Script(fmt or "hermes"))
    return asyncio.run(collect_rollouts(config, make_agent(), tasks, engine=engine))


@pytest.fixture(scope="module")
def collected(tmp_path_factory, tiny_tok):
    run_dir = tmp_path_factory.mktemp("collected")
    result = collect(run_dir, tiny_tok)
    return run_dir, result


def kind(rollout: Any) -> str:
    text = sorted(rollout.turns, key=lambda t: t.index)[-1].completion_text
    return {EXACT: "exact", LENIENT: "lenient", WRONG: "wrong"}[text]


# -- rendering and the round trip -----------------------------------------------------------------------------


def tool_conversation(prompt: str, answer: str = "The answer is 42.", source: str = "") -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "A1"}'}}
    return {"messages": [
        {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": answer},
    ], "tools": [LOOKUP]}


def test_the_mask_covers_each_reply_and_its_end_token_never_the_prompt_or_glue(tiny_tok):
    line = tool_conversation("What is the value for key A1?")
    ids, mask = render_conversation(tiny_tok, Conversation(tuple(line["messages"]), tuple(line["tools"])))
    trained = [i for i, m in zip(ids, mask) if m]
    assert tiny_tok.decode(trained, skip_special_tokens=False) == (
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call><|im_end|>The answer is 42.<|im_end|>')
    runs = [(m, sum(1 for _ in g)) for m, g in itertools.groupby(mask)]
    assert [m for m, _ in runs] == [0, 1, 0, 1]  # prompt, call, glue + tool result + generation prompt, answer
    im_end = tiny_tok.convert_tokens_to_ids("<|im_end|>")
    first_reply_end = runs[0][1] + runs[1][1]
    assert ids[first_reply_end - 1] == im_end and mask[first_reply_end] == 0  # the "\n" glue is not trained
    # an assistant message of weight 0 is context, not trained
    line["messages"][2]["weight"] = 0
    _, weighted = render_conversation(tiny_tok, Conversation(tuple(line["messages"]), tuple(line["tools"])))
    assert tiny_tok.decode([i for i, m in zip(ids, weighted) if m], skip_special_tokens=False) == \
        "The answer is 42.<|im_end|>"


def jsonl_of_rollout(rollout: Any, task: Task, path: Path) -> Path:
    """The rollout's conversation as an OpenAI fine-tuning line (messages + tools), through the rewards seam."""
    trajectory = trajectory_of(rollout, task)
    tools = sorted(rollout.turns, key=lambda t: t.index)[0].tools
    path.write_text(json.dumps({"messages": list(trajectory.messages), "tools": list(tools)}) + "\n")
    return path


def assert_round_trip(rollout: Any, task: Task, tokenizer: Any, fmt: str | None, tmp_path: Path) -> None:
    [conversation] = importer("openai")(jsonl_of_rollout(rollout, task, tmp_path / "line.jsonl"))
    ids, mask = render_conversation(tokenizer, conversation, fmt)
    turns = sorted(rollout.turns, key=lambda t: t.index)
    assert {t.segment for t in turns} == {0} and len(turns) == 2
    assert ids == list(turns[-1].prompt_ids) + list(turns[-1].completion_ids)
    [sample] = build_samples(rollout, [1.0] * len(turns))
    assert mask == list(sample.loss_mask_T)


def test_an_openai_jsonl_conversation_renders_to_the_ids_its_live_rollout_recorded(collected, tiny_tok, tmp_path):
    run_dir, result = collected
    rollout = next(r for r in result.rollouts if kind(r) == "exact")
    assert_round_trip(rollout, next(t for t in TASKS if t.id == rollout.task_id), tiny_tok, None, tmp_path)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "deepseek_v3"])
def test_the_round_trip_holds_in_the_families_whose_template_writes_replies_as_generated(fmt, tmp_path):
    tokenizer = family_tokenizer(fmt)
    result = collect(tmp_path / "run", tokenizer, fmt, tasks=TASKS[:1], group_size=1)
    [rollout] = result.rollouts
    assert_round_trip(rollout, TASKS[0], tokenizer, fmt, tmp_path)


# -- the store source -----------------------------------------------------------------------------------------


def test_the_store_source_keeps_the_rollouts_the_reward_and_strict_filters_pass(collected, tiny_tok):
    run_dir, result = collected
    assert Counter(kind(r) for r in result.rollouts) == {"exact": 4, "lenient": 4, "wrong": 4}
    renderer = conversation_renderer(tiny_tok)
    strict = StrictScorer(strict_exact)
    by_reward, selection = store_demonstrations(run_dir, renderer, min_reward=1.0)
    by_id = {r.id: r for r in result.rollouts}
    assert sorted(kind(by_id[d.name]) for d in by_reward) == ["exact"] * 4 + ["lenient"] * 4
    assert selection.left_out == {"with reward below 1": 4}
    by_strict, selection = store_demonstrations(run_dir, renderer, strict=strict)
    assert [kind(by_id[d.name]) for d in by_strict] == ["exact"] * 4
    assert selection.left_out == {"failed by the strict scorer": 8}
    both, _ = store_demonstrations(run_dir, renderer, min_reward=0.5, strict=strict)
    assert {d.name for d in both} == {d.name for d in by_strict}
    for demo in by_strict:  # the stored ids exactly: one sequence, advantage 1, mask on every completion token
        turns = sorted(by_id[demo.name].turns, key=lambda t: t.index)
        [sample] = demo.samples
        assert sample.token_ids_T == turns[-1].prompt_ids + turns[-1].completion_ids
        assert sum(sample.loss_mask_T) == sum(len(t.completion_ids) for t in turns) == demo.tokens
        assert set(sample.advantages_T) == {0.0, 1.0} and demo.group == by_id[demo.name].task_id


def test_the_store_source_refuses_no_filter_other_ids_and_unrecorded_rewards(collected, tiny_tok):
    run_dir, result = collected
    with pytest.raises(ValueError, match="--min-reward and/or --strict"):
        store_demonstrations(run_dir, conversation_renderer(tiny_tok))
    other = conversation_renderer(family_tokenizer("llama3_json"), "llama3_json")
    with pytest.raises(ValueError, match="rendered with chat_format 'hermes'.*llama3_json"):
        store_demonstrations(run_dir, other, min_reward=1.0)
    with pytest.raises(ValueError, match="holds no trajectories.db"):
        store_demonstrations(run_dir / "nowhere", conversation_renderer(tiny_tok), min_reward=1.0)
    tasks = {t.id: t for t in TASKS}
    unreported = [replace(r, reward=None) for r in result.rollouts[:2]]
    validation = [replace(r, group_id="val-s0-t0") for r in result.rollouts[2:3]]
    kept = select_rollouts(unreported + validation, tasks, min_reward=0.0)
    assert kept.kept == () and kept.left_out == {"without a reported reward": 2, "of validation/evaluation passes": 1}


# -- the OpenAI JSONL source: bad lines --------------------------------------------------------------------------


@pytest.mark.parametrize("line, message", [
    ("{not json", r"x.jsonl:2: not valid JSON"),
    ('{"messages": []}', r"x.jsonl:2: messages must be a non-empty list"),
    ('{"messages": [{"role": "user", "content": "hi"}], "functions": []}', r"x.jsonl:2: unknown key 'functions'.*tools"),
    ('{"input": {}, "preferred_output": []}', r"x.jsonl:2: unknown key 'input'; this is a preference"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', r"x.jsonl:2: messages\[0\]\.role: unknown role 'robot'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r"x.jsonl:2: messages has no assistant message"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "weight": 2}]}',
     r"x.jsonl:2: messages\[1\]\.weight must be 0 or 1, got 2"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}, '
     '{"role": "assistant", "content": "ok"}]}', r"x.jsonl:2: messages\[1\] is a tool result, but no assistant"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": '
     '"function", "function": {"name": "lookup", "arguments": "[1]"}}]}, {"role": "tool", "tool_call_id": "c1", '
     '"content": "4"}, {"role": "assistant", "content": "ok"}]}',
     r"x.jsonl:2: messages\[1\]\.tool_calls\[0\]\.function\.arguments must be a JSON object"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": '
     '"function", "function": {"name": "lookup", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c9", '
     '"content": "4"}, {"role": "assistant", "content": "ok"}]}', r"x.jsonl:2: messages\[2\]\.tool_call_id 'c9'"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], "tools": [{"type": '
     '"retrieval"}]}', r"x.jsonl:2: tools\[0\]: only function tools"),
])
def test_a_bad_jsonl_line_is_named_by_line_and_field(tmp_path, line, message):
    good = json.dumps(tool_conversation("hello"))
    path = tmp_path / "x.jsonl"
    path.write_text(good + "\n" + line + "\n\n")
    with pytest.raises(ValueError, match=message):
        importer("openai")(path)


def test_a_jsonl_file_loads_every_line_and_names_its_source(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(json.dumps(tool_conversation(f"question {n}")) for n in range(3)) + "\n\n")
    conversations = importer("openai")(path)
    assert [c.source for c in conversations] == [f"{path}:{n}" for n in (1, 2, 3)]
    assert conversations[0].tools == (LOOKUP,) and conversations[2].messages[1]["content"] == "question 2"
    with pytest.raises(ValueError, match="no such file"):
        importer("openai")(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no conversation"):
        importer("openai")(tmp_path / "empty.jsonl")


# -- the SFT step ------------------------------------------------------------------------------------------------


def test_the_nll_loss_is_the_advantage_weighted_mean_negative_logprob():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    loss, metrics = LOSSES.get("nll")(logp, torch.zeros(1, 4), adv, mask)
    assert loss.item() == pytest.approx((1 + 2 + 4) / 3) and metrics["nll"] == pytest.approx(7 / 3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, -1 / 3, 0.0, -1 / 3])
    with pytest.raises(ValueError, match="tis_cap = 2.0: the nll loss takes no ratio"):
        LOSSES.get("nll")(logp, torch.zeros(1, 4), adv, mask, LossParams(tis_cap=2.0))


def sft_config(path: Path, model_dir: Path, run_dir: Path, **advanced: Any) -> Path:
    data = {"core": {"model": str(model_dir), "run_dir": str(run_dir), "lora_rank": 8, "lora_alpha": 16,
                     "learning_rate": 1e-3, "seed": 0},
            "advanced": {"precision": "fp32", "engine_options": {"dtype": "float32"}, **advanced}}
    path.write_text(yaml.safe_dump(data))
    return path


PROMPTS = ["What is the value for key A1?", "Look up A1 and tell me the value.", "Which value does A1 hold?",
           "A1: what value?", "Tell me the value stored under A1.", "Find the value for A1, please.",
           "Key A1 - value?", "I need the value of key A1.", "Value for A1?", "What does A1 map to?",
           "Check key A1.", "Get me A1's value."]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_model_dir):
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("sft")
    demos = tmp / "demos.jsonl"
    demos.write_text("".join(json.dumps(tool_conversation(p)) + "\n" for p in PROMPTS))
    config = sft_config(tmp / "sft.yaml", tiny_model_dir, tmp / "unused")
    buffer = io.StringIO()
    # lr 0.005 over 8 epochs learns for every adapter init tried (seeds 0-5: held-out loss falls each epoch, by
    # 1.12-1.18 nats; the call gains 31-33 nats); 0.02 over 4 epochs diverged for two of the six
    with contextlib.redirect_stdout(buffer):
        status = main(["sft", str(config), "--conversations", str(demos), "--out", str(tmp / "out"), "--epochs", "8",
                       "--lr", "0.005", "--held-out", "0.25", "--batch-size", "1"])
    lines = buffer.getvalue().splitlines()
    return tmp, config, status, lines


def test_sft_lowers_the_held_out_loss_and_prints_both_losses_per_epoch(sft_run):
    tmp, _, status, lines = sft_run
    assert status == 0
    report = json.loads((tmp / "out" / "sft.json").read_text())
    assert report["demonstrations"] == {"train": 9, "held_out": 3}
    epochs = report["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(1, 9))
    before, after = report["held_out_loss_before"], epochs[-1]["held_out_loss"]
    # the tiny model's LoRA cannot grow its tied embeddings, so its logits stay small: about 1 nat per token is
    # what it can gain (ln 512 = 6.2 at the start); a full fine-tune goes further
    held = [before] + [e["held_out_loss"] for e in epochs]
    assert all(b < a for a, b in zip(held, held[1:])) and held[-1] < before - 0.75, held
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    printed = [line for line in lines if "mtrl sft: epoch" in line]
    assert len(printed) == 8 and all("train loss" in line and "held-out loss" in line for line in printed)
    assert any("--init-adapter" in line and str(tmp / "out" / "adapter") in line for line in lines)
    assert (tmp / "out" / "adapter" / "adapter_config.json").is_file()


def call_logprob(config_path: Path, adapter: Path | None) -> float:
    """log p(the demonstrated lookup call + its end token | an unseen prompt) under the policy (+ ``adapter``)."""
    config = MtrlConfig.from_yaml(config_path)
    policy = policy_from_config(config, config.core.model)
    if adapter is not None:
        load_initial_weights(policy, adapter)
    line = tool_conversation("Please tell me what A1 is set to.")
    messages = line["messages"][:3]  # ends at the call
    conversation = Conversation(tuple(messages), tuple(line["tools"]))
    [sample] = conversation_renderer(policy.tokenizer).samples(conversation)
    [logprobs] = PolicyUpdate(policy, UpdateSettings(precision="fp32")).trained_logprobs([sample])
    return sum(logprobs)


def test_sft_raises_the_probability_of_the_demonstrated_tool_call(sft_run):
    tmp, config, _, _ = sft_run
    before = call_logprob(config, None)
    after = call_logprob(config, tmp / "out" / "adapter")
    print(f"log p(call) before {before:.2f}, after {after:.2f}")
    assert after > before + 20.0, (before, after)  # nats over the call's ~20 tokens


def test_full_fine_tuning_writes_a_whole_model_that_a_full_run_starts_from(tmp_path, tiny_model_dir, tiny_tok):
    torch.set_num_threads(1)
    config = MtrlConfig.from_yaml(sft_config(tmp_path / "full.yaml", tiny_model_dir, tmp_path / "run",
                                             full_finetune=True))
    lines = [json.dumps(tool_conversation(p)) for p in PROMPTS[:3]]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    demos = conversation_demonstrations(conversation_renderer(tiny_tok), importer("openai")(tmp_path / "d.jsonl"))
    result = sft(config, demos, tmp_path / "out", SftSettings(epochs=2, learning_rate=1e-3, held_out=0.0),
                 echo=lambda line: None)
    assert result.held_out == 0 and result.held_out_before is None and len(result.epochs) == 2
    assert not (result.adapter / "adapter_config.json").exists() and (result.adapter / "config.json").is_file()
    started = build_policy(tiny_model_dir, lora=False)
    load_initial_weights(started, result.adapter)
    saved = build_policy(result.adapter, lora=False)  # the folder is a model of its own, tokenizer included
    base = build_policy(tiny_model_dir, lora=False)
    pairs = list(zip(started.model.parameters(), saved.model.parameters(), base.model.parameters()))
    assert all(torch.equal(a, b) for a, b, _ in pairs) and not all(torch.equal(a, c) for a, _, c in pairs)
    assert saved.tokenizer is not None


# -- mtrl train from the adapter ---------------------------------------------------------------------------------


def rl_config(tmp: Path, model_dir: Path, engine: str, **advanced: Any) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"model": str(model_dir), "engine": engine, "run_dir": str(tmp / "run"), "lora_rank": 8,
                 "lora_alpha": 16, "group_size": 2, "train_batch_size": 1, "max_steps": 1, "max_turns": 1,
                 "sampling_params": {"max_tokens": 6}},
        "advanced": {"precision": "fp32", "engine_options": {"dtype": "float32"} if engine == "hf" else {},
                     "checkpoint_every": 0, "rollout_timeout_s": 60, **advanced},
    })


def answer_agent() -> Any:
    import _eval_agents as agents

    return agents.make_agent(lambda text, task: float("42" in text), tools=[])


def test_train_from_the_adapter_samples_its_first_step_from_the_sft_weights(sft_run, tiny_model_dir, tmp_path):
    sft_tmp, sft_yaml, _, _ = sft_run
    adapter = sft_tmp / "out" / "adapter"
    config = rl_config(tmp_path, tiny_model_dir, "hf", init_adapter=str(adapter))
    tasks = [{"id": "t0", "prompt": "What is the value for key A1?", "ground_truth": 42}]
    MultiTurnRLTrainer(agent_env=answer_agent(), training_dataset=tasks, config=config,
                       tracking=False).train(progress=False)
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        rollouts = [r for r in store.rollouts(step=0) if r.turns]
    finally:
        store.close()
    assert len(rollouts) == 2
    samples = [build_samples(r, [1.0] * len(r.turns))[0] for r in rollouts]
    served = [[x for t in sorted(r.turns, key=lambda t: t.index) for x in t.logprobs] for r in rollouts]

    def logprobs(adapter_folder: Path | None) -> list[list[float]]:
        policy = policy_from_config(config, tiny_model_dir)
        if adapter_folder is not None:
            load_initial_weights(policy, adapter_folder)
        return [list(x) for x in PolicyUpdate(policy, UpdateSettings(precision="fp32")).trained_logprobs(samples)]

    sft_logprobs, base_logprobs = logprobs(adapter), logprobs(None)
    for engine_side, sft_side, base_side in zip(served, sft_logprobs, base_logprobs):
        assert engine_side == pytest.approx(sft_side, abs=2e-3)  # step 0 sampled from the SFT'd weights
        assert max(abs(a - b) for a, b in zip(engine_side, base_side)) > 0.1  # ... and not from the base
    assert flatten_params(config.model_dump())["advanced.init_adapter"] == str(adapter)  # in the run's MLflow params


def test_pushed_weights_serve_the_adapter_at_version_0_and_resume_does_not_reload_it(sft_run, tiny_model_dir,
                                                                                   tiny_tok, tmp_path):
    sft_tmp = sft_run[0]
    adapter = tmp_path / "adapter"
    shutil.copytree(sft_tmp / "out" / "adapter", adapter)
    config = rl_config(tmp_path, tiny_model_dir, "scripted", init_adapter=str(adapter), checkpoint_every=1)
    config = config.with_overrides({"core.max_steps": 2})
    tasks = [{"id": "t0", "prompt": "What is the value for key A1?", "ground_truth": 42}]
    replies = iter(["ANSWER 42", "ANSWER 7"] * 8)
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: next(replies))
    first = MultiTurnRLTrainer(agent_env=answer_agent(), training_dataset=tasks, config=config, engine=engine,
                               tracking=False).train(progress=False, on_step=lambda report: True)
    assert first.final_step == 1
    path, version = engine.adapters[0]
    assert version == 0
    from safetensors.torch import load_file

    published, trained = load_file(str(Path(path) / "adapter_model.safetensors")), \
        load_file(str(adapter / "adapter_model.safetensors"))
    assert published.keys() == trained.keys() and all(torch.equal(published[k], trained[k]) for k in trained)
    shutil.rmtree(adapter)  # a resume restores its checkpoint; it never reads init_adapter again
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: next(replies))
    resumed = MultiTurnRLTrainer(agent_env=answer_agent(), training_dataset=tasks, config=config, engine=engine,
                                 resume=True, tracking=False).train(progress=False)
    assert (resumed.start_step, resumed.final_step) == (1, 2)


def test_bad_init_adapters_are_refused_before_the_first_rollout(sft_run, tiny_model_dir, tiny_tok, tmp_path):
    sft_tmp = sft_run[0]
    adapter = sft_tmp / "out" / "adapter"
    tasks = [{"id": "t0", "prompt": "hi", "ground_truth": 42}]

    def train(**overrides: Any) -> None:
        config = rl_config(tmp_path / str(len(list(tmp_path.iterdir()))), tiny_model_dir, "scripted")
        MultiTurnRLTrainer(agent_env=answer_agent(), training_dataset=tasks, config=config.with_overrides(overrides),
                           engine=ScriptedEngine(tiny_tok, ["never"]), tracking=False).train(progress=False)

    with pytest.raises(ValueError, match="advanced.init_adapter: .*nowhere' is not a folder"):
        train(**{"advanced.init_adapter": str(tmp_path / "nowhere")})
    with pytest.raises(ValueError, match="has r = 8, this run core.lora_rank = 4; set core.lora_rank: 8"):
        train(**{"advanced.init_adapter": str(adapter), "core.lora_rank": 4})
    with pytest.raises(ValueError, match="has no weight for .*target modules"):
        train(**{"advanced.init_adapter": str(adapter), "advanced.lora_target_modules": ["q_proj", "v_proj", "o_proj",
                                                                                        "k_proj", "up_proj",
                                                                                        "down_proj", "gate_proj",
                                                                                        "lm_head"]})
    with pytest.raises(ValueError, match="is not a LoRA adapter .*full_finetune"):
        train(**{"advanced.init_adapter": str(tiny_model_dir)})
    # full fine-tuning starts from a whole model folder, never from an adapter
    full = build_policy(tiny_model_dir, lora=False)
    with pytest.raises(ValueError, match="is a LoRA adapter, and this run fine-tunes every weight"):
        load_initial_weights(full, adapter)
    with torch.no_grad():
        for param in full.model.parameters():
            param.zero_()
    load_initial_weights(full, tiny_model_dir)
    fresh = build_policy(tiny_model_dir, lora=False)
    assert all(torch.equal(a, b) for a, b in zip(full.model.parameters(), fresh.model.parameters()))


def test_the_cli_refuses_filters_conversations_cannot_be_selected_by(tmp_path, tiny_model_dir):
    config = sft_config(tmp_path / "c.yaml", tiny_model_dir, tmp_path / "run")
    for flag, value in (("--strict", "m:f"), ("--split", "train")):
        with pytest.raises(SystemExit, match="--strict and --split select stored rollouts"):
            main(["sft", str(config), "--conversations", "x.jsonl", flag, value, "--out", str(tmp_path / "o")])
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps(tool_conversation("hi")) + "\n")
    with pytest.raises(SystemExit, match=r"--min-reward 1: .*demos.jsonl:1 records no reward \(only an mtrl run's"):
        main(["sft", str(config), "--conversations", str(demos), "--min-reward", "1", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):  # one source, not both
        main(["sft", str(config), "--conversations", "x.jsonl", "--from-run", "r", "--out", str(tmp_path / "o")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(tool_conversation("hi")) + "\n" + '{"messages": [{"role": "user"}], "id": 3}\n')
    with pytest.raises(SystemExit, match=r"mtrl sft: .*bad.jsonl:2: unknown key 'id'"):
        main(["sft", str(config), "--conversations", str(bad), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="mtrl sft: source: unknown trace source 'csv'; known: mlflow, openai, otel"):
        main(["sft", str(config), "--conversations", str(bad), "--source", "csv", "--out", str(tmp_path / "o")])
