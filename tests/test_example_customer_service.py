"""The customer service example: data, replayed and session tools, reward vs strict, the LangGraph agent end to end.

The agent runs against the real coordinator (scripted engine on 127.0.0.1):
a scripted policy replays the reference solver's replies for the ticket it
finds in its own prompt, so every recorded turn, tool call and reward can be
checked against what that ticket needs. Then one training step through
``MultiTurnRLTrainer``: with the tiny model served by the hf engine, and
with the scripted engine and the tiny model as the trained policy (so the
step has reward variance and really updates).
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

from examples.customer_service import (
    FIELDS,
    REFUND_CHECK,
    SPLIT_SIZES,
    SupportSession,
    case_id_for,
    dispatch,
    example_instance,
    generate,
    load_instances,
    lookup_tools,
    reward,
    solve,
    stale_files,
    strict_score,
)
from examples.customer_service import demos
from examples.customer_service.data import PACKAGE_DIR, SEED
from examples.customer_service.demos import demo_rows, tool_definitions, write_demos
from examples.customer_service.prompts import build_messages
from mtrl_adapters import rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.envs import Sandbox, SandboxError
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

pytest.importorskip("langgraph")
from examples.customer_service.agent import make_agent, run  # noqa: E402

ALL = [row for split in SPLIT_SIZES for row in load_instances(split)]
REPO = Path(__file__).resolve().parents[1]
TRUTH = {"resolution": "refund", "refund_amount": 26, "case_id": "CS4252"}


def _answer(**changes: Any) -> str:
    return "<final_output>" + json.dumps({**TRUTH, **changes}) + "</final_output>"


# --------------------------------------------------------------------------- data


def test_committed_files_are_what_the_generator_makes():
    assert stale_files() == []
    assert generate(SEED) == generate(SEED)  # deterministic
    assert generate(SEED + 1)["instances/train.jsonl"] != generate(SEED)["instances/train.jsonl"]


def test_splits_are_balanced_disjoint_and_keep_the_example_out():
    for split, size in SPLIT_SIZES.items():
        rows = load_instances(split)
        assert len(rows) == size and all(r["split"] == split for r in rows)
        counts = {res: sum(r["ground_truth"]["resolution"] == res for r in rows)
                  for res in ("refund", "replace", "escalate", "deny")}
        assert set(counts.values()) == {size // 4}, (split, counts)
    orders = [r["data"]["order_id"] for r in ALL]
    assert len(set(orders)) == len(orders) == len({r["id"] for r in ALL})
    assert example_instance()["data"]["order_id"] not in orders
    assert all(r["ground_truth"]["case_id"] == case_id_for(r["data"]["order_id"]) for r in ALL)


def test_the_reference_solver_derives_every_ground_truth_from_tool_outputs():
    for row in ALL:
        episode = solve(row)
        assert episode.answer == row["ground_truth"], row["id"]
        assert episode.session["refunded"] == row["ground_truth"]["refund_amount"]
        assert reward(episode.messages[-1]["content"], row["ground_truth"], episode.session)[0] == 1.0


# --------------------------------------------------------------------------- tools


def test_lookups_replay_the_same_row_and_answer_misses_with_an_error_result():
    with Sandbox("lookups") as sandbox:
        session = SupportSession(sandbox)
        first = dispatch(session, "lookup_order", {"order_id": "O1000"})
        assert first == dispatch(session, "lookup_order", '{"order_id": " o1000 "}')  # normalized key
        assert json.loads(first) == {"order_id": "O1000", "customer_id": "C100", "item": "blender",
                                     "amount": 80, "days_since_delivery": 20}
        assert "no record for order_id='O0001'" in dispatch(session, "lookup_order", {"order_id": "O0001"})
        assert "missing argument 'customer_id'" in dispatch(session, "lookup_customer", {"id": "C100"})
        assert "unknown argument 'id'" in dispatch(session, "lookup_customer", {"customer_id": "C100", "id": 1})
        assert "unknown tool 'refund_all'" in dispatch(session, "refund_all", {})
        assert "not valid JSON" in dispatch(session, "lookup_policy", "{issue: damaged")
        assert json.loads(dispatch(session, "lookup_policy", {"issue": "defective"}))["remedy"] == "refund"
    assert set(lookup_tools()) == {"lookup_order", "lookup_customer", "lookup_policy"}


def test_session_tools_keep_one_case_and_enforce_the_refund_rules():
    with Sandbox("session") as sandbox:
        s = SupportSession(sandbox)
        assert s.snapshot() == {"case_id": None, "order_id": None, "refunded": 0}
        assert "call open_case first" in s.issue_refund("CS2278", 80)["error"]
        opened = s.open_case("O1000")
        assert opened == {"case_id": "CS2278", "order_id": "O1000", "status": "open"}
        assert "already open" in s.open_case("O1000")["error"]
        assert "no open case 'CS0000'" in s.issue_refund("CS0000", 80)["error"]
        assert "order amount 80" in s.issue_refund("CS2278", 79)["error"]
        assert "whole number" in s.issue_refund("CS2278", "eighty")["error"]
        assert s.issue_refund("cs2278", "80") == {"case_id": "CS2278", "refunded": 80, "status": "refunded"}
        assert "already refunded" in s.issue_refund("CS2278", 80)["error"]
        assert s.snapshot() == {"case_id": "CS2278", "order_id": "O1000", "refunded": 80}
    with pytest.raises(SandboxError):
        s.open_case("O1000")  # the episode is over: its state is gone


def test_a_refund_over_the_customers_limit_is_refused():
    row = next(r for r in ALL if r["ground_truth"]["resolution"] == "escalate")
    with Sandbox("limit") as sandbox:
        s = SupportSession(sandbox)
        order = json.loads(dispatch(s, "lookup_order", {"order_id": row["data"]["order_id"]}))
        case = s.open_case(row["data"]["order_id"])
        refused = s.issue_refund(case["case_id"], order["amount"])
        assert "over the refund limit" in refused["error"] and s.snapshot()["refunded"] == 0


# --------------------------------------------------------------------------- reward vs strict

NO_REFUND = {"case_id": "CS4252", "order_id": "O3679", "refunded": 0}
REFUNDED = {**NO_REFUND, "refunded": 26}

CASES = [
    # name, text, session snapshot, reward, strict
    ("perfect", _answer(), None, 1.0, 1.0),
    ("perfect, text around the block", "Refund issued. " + _answer() + " Bye.", None, 1.0, 1.0),
    ("perfect, refund issued", _answer(), REFUNDED, 1.0, 1.0),
    ("one field wrong", _answer(resolution="replace"), None, 0.1 + 0.9 * 2 / 3, 0.0),
    ("case id wrong", _answer(case_id="CS0000"), None, 0.1 + 0.9 * 2 / 3, 0.0),
    ("amount as text", _answer(refund_amount="26"), None, 0.9 * 2 / 3, 0.0),
    ("said refund but never issued it", _answer(), NO_REFUND, 0.1 + 0.9 * 3 / 4, 0.0),
    ("resolution not allowed", _answer(resolution="refund_now"), None, 0.9 * 2 / 3, 0.0),
    ("wrong tag", _answer().replace("final_output", "final"), None, 0.0, 0.0),
    ("two blocks", _answer() + _answer(), None, 0.0, 0.0),
    ("not JSON", "<final_output>resolution=refund</final_output>", None, 0.0, 0.0),
    ("missing answer", "I have resolved the ticket.", None, 0.0, 0.0),
    ("empty", "", NO_REFUND, 0.0, 0.0),
]


@pytest.mark.parametrize("name,text,session,expected_reward,expected_strict", CASES, ids=[c[0] for c in CASES])
def test_reward_and_strict_score_on_hand_written_answers(name, text, session, expected_reward, expected_strict):
    score, metrics = reward(text, TRUTH, session)
    assert score == pytest.approx(expected_reward)
    assert strict_score(text, TRUTH, session) == expected_strict
    assert metrics["strict"] == expected_strict  # the metric the trainer logs is the strict score
    assert set(metrics) >= {f"field_acc/{f}" for f in FIELDS} | {"field_acc", "format_ok", "strict"}
    assert (f"field_acc/{REFUND_CHECK}" in metrics) == (session is not None)


def test_reward_and_strict_disagree_exactly_on_partial_answers():
    texts = [c[1] for c in CASES]
    partial = [t for t in texts if 0.0 < reward(t, TRUTH)[0] < 1.0]
    assert partial and all(strict_score(t, TRUTH) == 0.0 for t in partial)
    assert all(strict_score(t, TRUTH) == (reward(t, TRUTH)[0] == 1.0) for t in texts)


def test_reward_rejects_a_ground_truth_without_its_fields():
    with pytest.raises(ValueError, match="lacks field"):
        reward(_answer(), {"resolution": "refund"})


# --------------------------------------------------------------------------- the agent on the coordinator


def _ticket(prompt: str) -> str:
    return re.findall(r"Ticket (T\d+)", prompt)[-1]  # the last ticket: the worked example comes first


def _task(row: dict) -> Task:
    return Task(id=row["id"], prompt=row["prompt"], ground_truth=row["ground_truth"], data=row["data"])


def _reply(message: dict) -> ScriptedReply | str:
    if message.get("tool_calls"):
        fn = message["tool_calls"][0]["function"]
        return ScriptedReply.tool_call(fn["name"], json.loads(fn["arguments"]))
    return message["content"]


def solver_policy(rows: list[dict], wrong: set[str] = frozenset()) -> Any:
    """Replays the solver's replies for the prompt's ticket; tickets in ``wrong`` skip the refund yet claim it."""
    replies = {r["data"]["ticket_id"]: solve(r).replies for r in rows}

    def policy(request: Any, prompt: str) -> ScriptedReply | str:
        ticket = _ticket(prompt)
        script = replies[ticket]
        if ticket in wrong and script[-2]["tool_calls"][0]["function"]["name"] == "issue_refund":
            script = script[:-2] + script[-1:]
        return _reply(script[request.turn_index])

    return policy


def _specs(handle: Any, rows: list[dict], max_turns: int = 8) -> list[RolloutSpec]:
    out = []
    for row in rows:
        task = _task(row)
        made = handle.coordinator.create_rollout(task)
        out.append(RolloutSpec(made.rollout_id, made.group_id, task, made.token, handle.url, "policy",
                               SamplingParams(max_tokens=256), max_turns, 60.0))
    return out


async def _run_all(agent: Any, specs: list[RolloutSpec]) -> list[str]:
    async def one(spec: RolloutSpec) -> str:
        with rollout_scope(spec):
            return await agent(spec.task)

    return await asyncio.gather(*(one(s) for s in specs))


def _sandbox_dirs(specs: list[RolloutSpec]) -> set[str]:
    """The sandbox folders left in the temp dir by these rollouts (not another test's, on another worker)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("mtrl-sandbox-*")
            if any(p.name.startswith(f"mtrl-sandbox-{spec.rollout_id}-") for spec in specs)}


async def test_16_concurrent_tickets_each_record_their_own_turns_tools_session_and_reward(served, tiny_tok):
    rows = [r for r in ALL if r["split"] == "test"][:16]
    handle = served(ScriptedEngine(tiny_tok, solver_policy(rows)))
    specs = _specs(handle, rows)
    texts = await _run_all(run, specs)
    assert _sandbox_dirs(specs) == set()  # every episode's sandbox was torn down
    for spec, row, text in zip(specs, rows, texts):
        episode = solve(row)
        record = handle.store.get_rollout(spec.rollout_id)
        assert record.status is RolloutStatus.COMPLETED, record.error
        assert text == episode.messages[-1]["content"]
        # every LLM call: one turn per solver reply, each extending the ticket's own sequence
        assert len(record.turns) == len(episode.replies)
        assert all(t.break_reason is None and t.segment == 0 for t in record.turns)
        for turn in record.turns:
            users = [m for m in turn.messages if m.get("role") == "user"]
            assert _ticket(str(users[-1]["content"])) == row["data"]["ticket_id"]
        # every tool call, on the turn that asked for it, with this ticket's arguments and results
        expected = [m["tool_calls"][0] for m in episode.replies[:-1]]
        assert [c.name for c in record.tool_calls] == [c["function"]["name"] for c in expected]
        assert [c.arguments for c in record.tool_calls] == [json.loads(c["function"]["arguments"]) for c in expected]
        results = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert [c.result for c in record.tool_calls] == results
        assert [c.turn_index for c in record.tool_calls] == list(range(len(expected)))
        assert all(c.call_id == record.turns[c.turn_index].tool_calls[0]["id"] for c in record.tool_calls)
        assert all(c.status == "success" for c in record.tool_calls)  # no "already open": sessions are not shared
        assert record.reward == 1.0 and record.metrics["strict"] == 1.0
        assert record.metrics[f"field_acc/{REFUND_CHECK}"] == 1.0


async def test_claiming_a_refund_that_was_never_issued_is_caught_by_the_session_check(served, tiny_tok):
    rows = [r for r in ALL if r["ground_truth"]["resolution"] == "refund"][:2]
    handle = served(ScriptedEngine(tiny_tok, solver_policy(rows, wrong={rows[0]["data"]["ticket_id"]})))
    specs = _specs(handle, rows)
    await _run_all(run, specs)
    cheat, honest = (handle.store.get_rollout(s.rollout_id) for s in specs)
    assert cheat.reward == pytest.approx(0.1 + 0.9 * 3 / 4) and cheat.metrics["strict"] == 0.0
    assert cheat.metrics[f"field_acc/{REFUND_CHECK}"] == 0.0 and "issue_refund" not in [c.name for c in cheat.tool_calls]
    assert honest.reward == 1.0


async def test_an_agent_that_never_answers_stops_at_max_turns_with_zero_reward(served, tiny_tok):
    row = ALL[0]
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: ScriptedReply.tool_call(
        "lookup_order", {"order_id": row["data"]["order_id"]})))
    [spec] = _specs(handle, [row], max_turns=3)
    [text] = await _run_all(run, [spec])
    record = handle.store.get_rollout(spec.rollout_id)
    assert text == "" and record.status is RolloutStatus.COMPLETED
    # three model calls, no fourth (the coordinator would refuse it); the last one's tool call is not run
    assert len(record.turns) == 3 and record.turns[-1].tool_calls and len(record.tool_calls) == 2
    assert record.reward == 0.0 and record.metrics["completion"] == 0.0


# --------------------------------------------------------------------------- warm-start demonstrations


def test_demos_are_train_tickets_interleaved_by_resolution_in_the_jsonl_mtrl_sft_reads(tmp_path):
    from mtrl_runtime.warmstart import importer

    path = tmp_path / "demos.jsonl"
    assert demos.main(["--out", str(path), "--count", "6"]) == 0
    conversations = importer("openai")(path)
    rows = demo_rows(6)
    assert len(conversations) == 6 and all(r["split"] == "train" for r in rows)
    assert [r["ground_truth"]["resolution"] for r in rows] == ["refund", "replace", "escalate", "deny",
                                                               "refund", "replace"]
    for conv, row in zip(conversations, rows):
        messages = list(conv.messages)
        assert messages[:-len(solve(row).messages)] == [  # the agent's prompt, the example's replies not trained
            {**m, "weight": 0} if m["role"] == "assistant" else m for m in build_messages(row)]
        assert messages[-len(solve(row).messages):] == list(solve(row).messages)
        assert strict_score(messages[-1]["content"], row["ground_truth"]) == 1.0
        assert list(conv.tools) == tool_definitions()
    for bad in (0, 81):
        with pytest.raises(ValueError, match=rf"count must be between 1 and 80 .*got {bad}"):
            demo_rows(bad)


async def test_a_demo_renders_to_the_ids_the_agents_live_rollout_of_its_ticket_records(served, tiny_tok, tmp_path):
    """The demo is what the agent sees: rendered for the student, it is token for token the sequence the policy
    endpoint records when the model writes the solver's replies, and the loss covers those replies only."""
    from mtrl_runtime.warmstart import importer, render_conversation

    rows = demo_rows(4)  # one of each resolution: 5, 4, 4 and 4 tool calls
    handle = served(ScriptedEngine(tiny_tok, solver_policy(rows)))
    specs = _specs(handle, rows)
    await _run_all(run, specs)
    conversations = importer("openai")(write_demos(tmp_path / "demos.jsonl", 4))
    for spec, row, conv in zip(specs, rows, conversations):
        turns = sorted(handle.store.get_rollout(spec.rollout_id).turns, key=lambda t: t.index)
        assert len(turns) == len(solve(row).replies) and all(t.segment == 0 for t in turns)
        assert list(turns[0].tools) == list(conv.tools)
        ids, mask = render_conversation(tiny_tok, conv)
        assert ids == list(turns[-1].prompt_ids) + list(turns[-1].completion_ids)
        assert [i for i, m in zip(ids, mask) if m] == [i for t in turns for i in t.completion_ids]


# --------------------------------------------------------------------------- config and training


def test_the_config_validates_and_names_the_train_split():
    config = MtrlConfig.from_yaml(PACKAGE_DIR / "config.yaml")
    assert (REPO / config.core.dataset).resolve() == (PACKAGE_DIR / "instances" / "train.jsonl").resolve()
    assert config.core.model == "smollm2-135m" and config.core.engine == "hf"
    from mtrl_runtime.cli import load_agent

    assert load_agent("examples.customer_service.agent:run") is run


def _train_config(run_dir: Path, **core: Any) -> MtrlConfig:
    base = {"run_dir": str(run_dir), "group_size": 2, "train_batch_size": 2, "max_steps": 1, "max_turns": 6,
            "lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-3, "sampling_params": {"max_tokens": 16}}
    return MtrlConfig.from_dict({"core": {**base, **core},
                                 "advanced": {"checkpoint_every": 0, "rollout_timeout_s": 60}})


@pytest.mark.timeout(120)
def test_one_training_step_with_the_tiny_model_on_the_hf_engine(tmp_path, tiny_tok):
    import torch

    from mtrl_runtime.engines import HFEngine
    from mtrl_runtime.testing import tiny_model
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    agent = make_agent(with_examples=False)  # the same agent with a shorter prompt: a random model needs no example
    trainer = MultiTurnRLTrainer(agent_env=agent, training_dataset=ALL[:2], config=_train_config(tmp_path / "run"),
                                 engine=HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok), tracking=False)
    result = trainer.train(progress=False)
    [report] = result.reports
    assert report.metrics["rollout/count"] == 4 and report.metrics["rollout/completed_frac"] == 1.0
    assert report.metrics["rollout/reward_defaulted_frac"] == 0.0  # the agent reported every reward
    assert "rollout/metrics/strict" in report.metrics
    assert (result.output_adapter_path / "adapter_config.json").is_file()


@pytest.mark.timeout(120)
def test_one_training_step_updates_the_tiny_policy_when_rewards_differ(tmp_path, tiny_tok, tiny_model_dir):
    """Scripted replies (one right, one wrong per group) give the group a reward spread; the tiny model trains on it."""
    import torch

    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    rows = [r for r in ALL if r["ground_truth"]["resolution"] == "refund"][:2]
    right = solver_policy(rows)
    first: dict[str, str] = {}  # ticket -> the rollout that answers it right

    def policy(request: Any, prompt: str) -> ScriptedReply | str:
        if first.setdefault(_ticket(prompt), request.rollout_id) == request.rollout_id:
            return right(request, prompt)
        return _answer(resolution="deny", refund_amount=0)  # answers at once, wrongly

    trainer = MultiTurnRLTrainer(agent_env=run, training_dataset=rows, engine=ScriptedEngine(tiny_tok, policy),
                                 config=_train_config(tmp_path / "run", model=str(tiny_model_dir),
                                                      sampling_params={"max_tokens": 256}), tracking=False)
    result = trainer.train(progress=False)
    metrics = result.reports[0].metrics
    assert metrics["rollout/reward/max"] == 1.0 and metrics["rollout/reward/min"] < 0.5
    assert metrics.get("train/skipped", 0.0) == 0.0 and metrics["analysis/zero_adv_groups"] == 0.0
    assert metrics["samples/count"] == 4
    assert _lora_b_norm(result.output_adapter_path) > 0  # LoRA starts with B = 0: the step moved the policy


def _lora_b_norm(adapter: Path) -> float:
    from safetensors.torch import load_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    return sum(float(t.norm()) for name, t in tensors.items() if "lora_B" in name)
