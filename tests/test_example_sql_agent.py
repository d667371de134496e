"""The SQL agent example: data, the per-episode database, reward vs strict, the OpenAI-client agent end to end.

The agent runs against the real coordinator (scripted engine on 127.0.0.1):
the scripted policy finds the question in its own prompt and queries with
that question's gold SQL, so every recorded turn, tool call and reward can
be checked against the question. Then one training step through
``MultiTurnRLTrainer``: with the tiny model served by the hf engine, and
with the scripted engine and the tiny model as the trained policy (so the
step has reward variance and really updates).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from examples.sql_agent import (
    EXAMPLE_QUESTION,
    SPLIT_SIZES,
    TOOL_NAME,
    call_tool,
    company_env,
    execute,
    format_answer,
    generate,
    load_instances,
    reward,
    stale_files,
    strict_score,
)
from examples.sql_agent.agent import make_agent, run
from examples.sql_agent.data import PACKAGE_DIR, SEED, informative
from mtrl_adapters import rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.envs import check_isolation
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

ALL = [row for split in SPLIT_SIZES for row in load_instances(split)]
REPO = Path(__file__).resolve().parents[1]

DEPT_COUNT = {"sql": "SELECT COUNT(*) FROM employees JOIN departments ON employees.department_id = departments.id "
                     "WHERE departments.name = 'Sales'", "ordered": False}
TOP3 = {"sql": "SELECT name FROM employees ORDER BY salary DESC LIMIT 3", "ordered": True}
YEAR = {"sql": "SELECT name FROM employees WHERE hire_year = 2016", "ordered": False}


# --------------------------------------------------------------------------- data


def test_committed_files_are_what_the_generator_makes():
    assert stale_files() == []
    assert generate(SEED) == generate(SEED)  # deterministic
    assert generate(SEED + 1)["instances/train.jsonl"] != generate(SEED)["instances/train.jsonl"]


def test_splits_hold_distinct_informative_questions_over_every_template():
    for split, size in SPLIT_SIZES.items():
        rows = load_instances(split)
        assert len(rows) == size and all(r["split"] == split for r in rows)
    assert len({r["id"] for r in ALL}) == len({r["prompt"] for r in ALL}) == len(ALL)
    assert EXAMPLE_QUESTION not in {r["prompt"] for r in ALL}
    train_templates = {r["data"]["template"] for r in ALL if r["split"] == "train"}
    assert train_templates == {r["data"]["template"] for r in ALL} and len(train_templates) == 14
    for row in ALL:
        gold = execute(row["ground_truth"]["sql"])
        assert "error" not in gold and informative(gold["rows"]), row["id"]


# --------------------------------------------------------------------------- the per-episode database


def test_query_database_is_read_only_bounded_and_answers_mistakes_with_error_results():
    with company_env().open() as db:
        rows = call_tool(db, TOOL_NAME, {"sql": "SELECT name FROM departments ORDER BY id"})
        assert rows["rows"][:2] == [["Engineering"], ["Sales"]] and rows["columns"] == ["name"]
        assert call_tool(db, TOOL_NAME, '{"sql": "SELECT * FROM assignments"}')["truncated"] is True  # > 20 rows
        assert "read-only" in call_tool(db, TOOL_NAME, {"sql": "DELETE FROM employees"})["error"]
        assert "no such table" in call_tool(db, TOOL_NAME, {"sql": "SELECT * FROM staff"})["error"]
        assert "not valid JSON" in call_tool(db, TOOL_NAME, "{sql: SELECT 1")["error"]
        assert "unknown argument 'query'" in call_tool(db, TOOL_NAME, {"query": "SELECT 1"})["error"]
        assert "unknown tool 'drop_table'" in call_tool(db, "drop_table", {})["error"]
        assert db.fetch_all("SELECT COUNT(*) FROM employees") == [(30,)]  # the refused write changed nothing


async def test_concurrent_episodes_each_get_their_own_database():
    async def episode(marker: str) -> list:
        with company_env().open() as db:
            db.execute("UPDATE departments SET city = ? WHERE id = 1", (marker,))  # the environment writes
            await asyncio.sleep(0.01)  # let the other episodes write theirs
            return db.fetch_all("SELECT city FROM departments")

    report = await check_isolation(episode, runs=16)
    assert report.isolated, str(report)
    with company_env().open() as db:
        assert db.fetch_all("SELECT city FROM departments WHERE id = 1") == [("Berlin",)]


# --------------------------------------------------------------------------- reward vs strict

CASES = [
    # name, text, ground truth, reward, strict
    ("gold query", format_answer(DEPT_COUNT["sql"]), DEPT_COUNT, 1.0, 1.0),
    ("equivalent query", format_answer("SELECT COUNT(*) FROM employees e WHERE e.department_id = "
                                       "(SELECT id FROM departments WHERE name = 'Sales')"), DEPT_COUNT, 1.0, 1.0),
    ("text around the block", "Here it is: " + format_answer(YEAR["sql"]) + " Done.", YEAR, 1.0, 1.0),
    ("rows in another order, order not asked", format_answer(YEAR["sql"] + " ORDER BY name DESC"), YEAR, 1.0, 1.0),
    ("ordered question, right order", format_answer("SELECT name FROM employees ORDER BY salary DESC LIMIT 3"),
     TOP3, 1.0, 1.0),
    ("ordered question, wrong order", format_answer("SELECT name FROM (SELECT name, salary FROM employees ORDER BY "
                                                    "salary DESC LIMIT 3) ORDER BY salary"), TOP3, 0.3, 0.0),
    ("wrong department", format_answer(DEPT_COUNT["sql"].replace("Sales", "Finance")), DEPT_COUNT, 0.3, 0.0),
    ("wrong year, as many rows", format_answer(YEAR["sql"].replace("2016", "2021")), YEAR, 0.3, 0.0),
    ("extra column", format_answer("SELECT name, hire_year FROM employees WHERE hire_year = 2016"), YEAR, 0.3, 0.0),
    ("syntax error", format_answer("SELEC name FROM employees"), YEAR, 0.1, 0.0),
    ("a write", format_answer("DELETE FROM employees"), YEAR, 0.1, 0.0),
    ("two statements", format_answer("SELECT 1; SELECT 2"), YEAR, 0.1, 0.0),
    # without one well-formed block the reward grades the first bare statement (a foothold); strict does not
    ("wrong tag, right query", YEAR["sql"].join(["<sql>", "</sql>"]), YEAR, 0.9, 0.0),
    ("two blocks", format_answer(YEAR["sql"]) * 2, YEAR, 0.9, 0.0),
    ("bare query in a code fence", "```sql\n" + YEAR["sql"] + ";\n```", YEAR, 0.9, 0.0),
    ("bare query with a comparison", "Run SELECT name FROM employees WHERE hire_year = 2016 AND salary < 1000000",
     YEAR, 0.9, 0.0),
    ("bare query, wrong", "SELECT name FROM employees", YEAR, 0.2, 0.0),
    ("wrong tag, broken query", "<tool_response>SELECT COUNT(*) FROM projects WHERE hire_year = 2020</tool_response>",
     YEAR, 0.0, 0.0),
    ("empty block", format_answer("  "), YEAR, 0.0, 0.0),
    ("missing answer", "The employees hired in 2016 are listed above.", YEAR, 0.0, 0.0),
]


@pytest.mark.parametrize("name,text,truth,expected_reward,expected_strict", CASES, ids=[c[0] for c in CASES])
def test_reward_and_strict_score_on_hand_written_answers(name, text, truth, expected_reward, expected_strict):
    score, metrics = reward(text, truth)
    assert score == pytest.approx(expected_reward)
    assert strict_score(text, truth) == expected_strict
    assert metrics["strict"] == expected_strict
    assert set(metrics) == {"format_ok", "executes", "match", "strict", "completion"}


def test_reward_and_strict_disagree_exactly_on_partial_answers():
    scored = [(reward(text, truth)[0], strict_score(text, truth)) for _, text, truth, _, _ in CASES]
    assert any(0.0 < r < 1.0 for r, _ in scored)
    assert all(s == (r == 1.0) for r, s in scored)


def test_a_broken_ground_truth_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="gold query fails"):
        reward(format_answer("SELECT 1"), {"sql": "SELECT nothing FROM nowhere"})
    with pytest.raises(ValueError, match="'sql' string"):
        reward(format_answer("SELECT 1"), {"query": "SELECT 1"})


# --------------------------------------------------------------------------- the agent on the coordinator


def _question(prompt: str, rows: list[dict]) -> dict:
    """The row whose question the prompt ends with (the worked example comes before it)."""
    found = [(prompt.rfind(r["prompt"]), r) for r in rows if r["prompt"] in prompt]
    return max(found, key=lambda pair: pair[0])[1]


def gold_policy(rows: list[dict], typo_first: bool = False) -> Any:
    """Queries with the question's gold SQL (after a misspelt one when ``typo_first``), then answers with it."""

    def policy(request: Any, prompt: str) -> ScriptedReply | str:
        sql = _question(prompt, rows)["ground_truth"]["sql"]
        script = [ScriptedReply.tool_call(TOOL_NAME, {"sql": sql}), format_answer(sql)]
        if typo_first:
            script.insert(0, ScriptedReply.tool_call(TOOL_NAME, {"sql": sql.replace("SELECT", "SELEC", 1)}))
        return script[request.turn_index]

    return policy


def _specs(handle: Any, rows: list[dict], max_turns: int = 6) -> list[RolloutSpec]:
    out = []
    for row in rows:
        task = Task(id=row["id"], prompt=row["prompt"], ground_truth=row["ground_truth"], data=row["data"])
        made = handle.coordinator.create_rollout(task)
        out.append(RolloutSpec(made.rollout_id, made.group_id, task, made.token, handle.url, "policy",
                               SamplingParams(max_tokens=256), max_turns, 60.0))
    return out


async def _run_all(agent: Any, specs: list[RolloutSpec]) -> list[str]:
    async def one(spec: RolloutSpec) -> str:
        with rollout_scope(spec):
            return await agent(spec.task)

    return await asyncio.gather(*(one(s) for s in specs))


async def test_16_concurrent_questions_each_record_their_own_turns_queries_and_reward(served, tiny_tok):
    rows = [r for r in ALL if r["split"] == "test"][:16]
    handle = served(ScriptedEngine(tiny_tok, gold_policy(rows)))
    specs = _specs(handle, rows)
    texts = await _run_all(run, specs)
    for spec, row, text in zip(specs, rows, texts):
        sql = row["ground_truth"]["sql"]
        record = handle.store.get_rollout(spec.rollout_id)
        assert record.status is RolloutStatus.COMPLETED, record.error
        assert text == format_answer(sql)
        assert len(record.turns) == 2 and all(t.break_reason is None and t.segment == 0 for t in record.turns)
        for turn in record.turns:  # every model call carried this question, last among the user messages
            assert [m for m in turn.messages if m["role"] == "user"][-1]["content"] == row["prompt"]
        [call] = record.tool_calls
        assert (call.name, call.arguments, call.turn_index, call.status) == (TOOL_NAME, {"sql": sql}, 0, "success")
        assert call.call_id == record.turns[0].tool_calls[0]["id"]
        with company_env().open() as db:
            assert call.result == db.query(sql)  # what this question's query returns, nobody else's
        assert record.reward == 1.0 and record.metrics["strict"] == 1.0


async def test_a_failing_query_is_an_error_result_the_agent_recovers_from(served, tiny_tok):
    rows = ALL[:1]
    handle = served(ScriptedEngine(tiny_tok, gold_policy(rows, typo_first=True)))
    [spec] = _specs(handle, rows)
    await _run_all(run, [spec])
    record = handle.store.get_rollout(spec.rollout_id)
    first, second = record.tool_calls
    assert first.status == "error" and "syntax error" in first.error and second.status == "success"
    assert "syntax error" in json.dumps(record.turns[1].messages)  # the model saw its mistake
    assert len(record.turns) == 3 and record.reward == 1.0


async def test_an_agent_that_never_answers_stops_at_max_turns_with_zero_reward(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: ScriptedReply.tool_call(
        TOOL_NAME, {"sql": "SELECT 1"})))
    [spec] = _specs(handle, ALL[:1], max_turns=3)
    [text] = await _run_all(run, [spec])
    record = handle.store.get_rollout(spec.rollout_id)
    assert text == "" and record.status is RolloutStatus.COMPLETED  # no fourth call for the coordinator to refuse
    assert len(record.turns) == 3 and len(record.tool_calls) == 3
    assert record.reward == 0.0 and record.metrics["completion"] == 0.0


# --------------------------------------------------------------------------- warm-start demonstrations


def _answer_policy(rows: list[dict]) -> Any:
    """Answers at once with the question's gold SQL, as a demonstration does (no tool round trip)."""
    return lambda request, prompt: format_answer(_question(prompt, rows)["ground_truth"]["sql"])


def test_demos_are_train_questions_in_turn_by_template_in_the_jsonl_mtrl_sft_reads(tmp_path):
    from examples.sql_agent import demos
    from examples.sql_agent.prompts import build_messages
    from mtrl_runtime.warmstart import importer

    path = tmp_path / "demos.jsonl"
    assert demos.main(["--out", str(path), "--count", "16"]) == 0
    conversations = importer("openai")(path)
    rows = demos.demo_rows(16)
    train = [r for r in ALL if r["split"] == "train"]
    templates = list(dict.fromkeys(r["data"]["template"] for r in train))
    assert len(conversations) == 16 and all(r["split"] == "train" for r in rows)
    assert [r["data"]["template"] for r in rows[:len(templates)]] == templates  # one of each before any twice
    for conv, row in zip(conversations, rows):
        messages = list(conv.messages)
        assert messages[:-1] == [{**m, "weight": 0} if m["role"] == "assistant" else m for m in build_messages(row)]
        assert messages[-1] == {"role": "assistant", "content": format_answer(row["ground_truth"]["sql"])}
        assert strict_score(messages[-1]["content"], row["ground_truth"]) == 1.0
        assert [t["function"]["name"] for t in conv.tools] == [TOOL_NAME]
    for bad in (0, 81):
        with pytest.raises(ValueError, match=rf"count must be between 1 and 80 .*got {bad}"):
            demos.demo_rows(bad)


async def test_a_demo_renders_to_the_ids_the_agents_live_rollout_of_its_question_records(served, tiny_tok, tmp_path):
    """The demo is what the agent sees: rendered for the student, it is token for token the sequence the policy
    endpoint records when the model answers with the gold query, and the loss covers that answer only."""
    from examples._demos import write_demos
    from examples.sql_agent.demos import conversation, demo_rows
    from mtrl_runtime.warmstart import importer, render_conversation

    rows = demo_rows(3)
    handle = served(ScriptedEngine(tiny_tok, _answer_policy(rows)))
    specs = _specs(handle, rows)
    await _run_all(run, specs)
    conversations = importer("openai")(write_demos(tmp_path / "demos.jsonl", rows, conversation))
    for spec, conv in zip(specs, conversations):
        record = handle.store.get_rollout(spec.rollout_id)
        assert record.reward == 1.0 and len(record.turns) == 1
        turn = record.turns[0]
        assert list(turn.tools) == list(conv.tools)
        ids, mask = render_conversation(tiny_tok, conv)
        assert ids == list(turn.prompt_ids) + list(turn.completion_ids)
        assert [i for i, m in zip(ids, mask) if m] == list(turn.completion_ids)


# --------------------------------------------------------------------------- config and training


def test_the_model_client_waits_as_long_as_the_rollout_may_run():
    """Inside a rollout the client's timeout is the rollout's deadline (it used to give up after openai's 600 s,
    failing episodes the run still had time for, with no retry); outside one, openai's default."""
    import openai

    from examples.sql_agent.agent import make_client

    spec = RolloutSpec("r1", "g1", Task(id="t", prompt="q"), "tok", "http://127.0.0.1:1/v1", "policy",
                       SamplingParams(max_tokens=8), 6, 1800.0)
    with rollout_scope(spec):
        assert make_client().timeout == 1800.0
    assert make_client().timeout == openai.DEFAULT_TIMEOUT


def test_the_config_validates_and_names_the_train_split():
    config = MtrlConfig.from_yaml(PACKAGE_DIR / "config.yaml")
    assert (REPO / config.core.dataset).resolve() == (PACKAGE_DIR / "instances" / "train.jsonl").resolve()
    assert config.core.model == "smollm2-135m" and config.core.engine == "hf"
    from mtrl_runtime.cli import load_agent

    assert load_agent("examples.sql_agent.agent:run") is run


def _train_config(run_dir: Path, **core: Any) -> MtrlConfig:
    base = {"run_dir": str(run_dir), "group_size": 2, "train_batch_size": 2, "max_steps": 1, "max_turns": 4,
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
    trainer = MultiTurnRLTrainer(agent_env=make_agent(with_examples=False), training_dataset=ALL[:2],
                                 config=_train_config(tmp_path / "run"),
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
    from safetensors.torch import load_file

    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    rows = ALL[:2]
    right = gold_policy(rows)
    first: dict[str, str] = {}  # question -> the rollout that answers it right

    def policy(request: Any, prompt: str) -> ScriptedReply | str:
        if first.setdefault(_question(prompt, rows)["id"], request.rollout_id) == request.rollout_id:
            return right(request, prompt)
        return format_answer("SELECT name FROM departments")  # answers at once, wrongly

    trainer = MultiTurnRLTrainer(agent_env=run, training_dataset=rows, engine=ScriptedEngine(tiny_tok, policy),
                                 config=_train_config(tmp_path / "run", model=str(tiny_model_dir),
                                                      sampling_params={"max_tokens": 256}), tracking=False)
    result = trainer.train(progress=False)
    metrics = result.reports[0].metrics
    assert metrics["rollout/reward/max"] == 1.0 and metrics["rollout/reward/min"] == pytest.approx(0.3)
    assert metrics.get("train/skipped", 0.0) == 0.0 and metrics["analysis/zero_adv_groups"] == 0.0
    assert metrics["samples/count"] == 4
    tensors = load_file(str(result.output_adapter_path / "adapter_model.safetensors"))
    assert sum(float(t.norm()) for name, t in tensors.items() if "lora_B" in name) > 0  # LoRA B starts at 0
