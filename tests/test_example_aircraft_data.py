"""The aircraft inspection example: data, tools, reference solver, prompts, reward and strict evaluation."""

from __future__ import annotations

import inspect
import json

import pytest

from examples.aircraft_inspection import (
    EXAMPLE_STATES,
    FIELD_SETS,
    FIELDS,
    SOP_ORDER,
    SPLIT_SIZES,
    CHECKS,
    TOOL_SPECS,
    InspectionSession,
    build_messages,
    dispatch,
    example_instance,
    format_answer,
    generate,
    lenient_reward,
    load_instances,
    parse_final_output,
    reward,
    solve,
    strict_score,
)
from examples.aircraft_inspection.data import PACKAGE_DIR, SEED

ALL = [row for split in SPLIT_SIZES for row in load_instances(split)]
TRUTH = {"aircraft_valid": True, "maintenance_due": False, "mechanical_status": "fail",
         "electrical_status": "pass", "incident_flag": False, "decision": "ground"}
PERFECT = format_answer(TRUTH)


def _with(**changes: object) -> str:
    return "<final_output>" + json.dumps({**TRUTH, **changes}) + "</final_output>"


# --- reward vs strict evaluation on hand-written outputs ------------------------------

@pytest.mark.parametrize(
    "name, text, expected_reward, expected_strict",
    [
        ("perfect", PERFECT, 1.0, 1.0),
        ("extra text around the tags", "All checks done.\n" + PERFECT + "\nReport filed.", 1.0, 1.0),
        ("wrong tag", PERFECT.replace("final_output", "final_answer"), 0.0, 0.0),
        ("missing answer", "I inspected the aircraft; it should be grounded.", 0.0, 0.0),
        ("empty", "", 0.0, 0.0),
        ("two blocks", PERFECT + PERFECT, 0.0, 0.0),
        ("unclosed tag", PERFECT.replace("</final_output>", ""), 0.0, 0.0),
        ("not json", "<final_output>decision=ground</final_output>", 0.0, 0.0),
        ("a json list", "<final_output>[1, 2]</final_output>", 0.0, 0.0),
    ],
)
def test_reward_and_strict_agree_on_clear_cases(name, text, expected_reward, expected_strict):
    value, metrics = reward(text, TRUTH)
    assert value == pytest.approx(expected_reward), name
    assert strict_score(text, TRUTH) == expected_strict, name
    assert metrics["strict"] == expected_strict
    assert metrics["format_ok"] == float(expected_reward == 1.0)


def test_one_wrong_field_keeps_most_reward_but_fails_strict():
    text = _with(decision="release")
    value, metrics = reward(text, TRUTH)
    assert value == pytest.approx(0.9 * 5 / 6 + 0.1)
    assert metrics["field_acc/decision"] == 0.0 and metrics["field_acc/mechanical_status"] == 1.0
    assert metrics["field_acc"] == pytest.approx(5 / 6) and metrics["format_ok"] == 1.0
    assert strict_score(text, TRUTH) == 0.0


def test_exact_types_are_required():
    as_string = _with(aircraft_valid="true")
    as_int = _with(incident_flag=0)
    wrong_case = _with(mechanical_status="FAIL")
    for text in (as_string, as_int, wrong_case):
        value, metrics = reward(text, TRUTH)
        assert metrics["format_ok"] == 0.0 and metrics["field_acc"] == pytest.approx(5 / 6)
        assert value == pytest.approx(0.9 * 5 / 6)
        assert strict_score(text, TRUTH) == 0.0


def test_missing_field_and_duplicate_key_fail():
    partial = "<final_output>" + json.dumps({k: v for k, v in TRUTH.items() if k != "decision"}) + "</final_output>"
    assert reward(partial, TRUTH)[1]["format_ok"] == 0.0 and strict_score(partial, TRUTH) == 0.0
    duplicate = PERFECT.replace('"decision": "ground"', '"decision": "release", "decision": "ground"')
    assert parse_final_output(duplicate) is None
    assert strict_score(duplicate, TRUTH) == 0.0


def test_field_subset_is_scored_alone():
    three = FIELD_SETS["three"]
    text = _with(aircraft_valid=False, incident_flag=True)  # wrong only outside the subset
    assert reward(text, TRUTH, three)[0] == 1.0 and strict_score(text, TRUTH, three) == 1.0
    assert strict_score(text, TRUTH) == 0.0
    metrics = reward(format_answer(TRUTH, three), TRUTH, three)[1]
    assert set(metrics) == {*(f"field_acc/{n}" for n in three), "field_acc", "format_ok", "strict"}


def test_unknown_field_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'airworthy'"):
        reward(PERFECT, TRUTH, ("decision", "airworthy"))
    with pytest.raises(ValueError, match="lacks field"):
        strict_score(PERFECT, {"decision": "ground"})


def test_lenient_and_strict_disagree_on_untagged_answers():
    untagged = json.dumps(TRUTH)
    key_value = ("aircraft_valid=yes maintenance_due=no mechanical_status=FAIL electrical_status=pass "
                 "incident_flag=no decision=Ground")
    for text in (untagged, key_value, PERFECT.replace("final_output", "FINAL_OUTPUT")):
        assert lenient_reward(text, TRUTH)[0] == 1.0
        assert strict_score(text, TRUTH) == 0.0 and reward(text, TRUTH)[0] == 0.0
    # on a well-formed answer both agree
    assert lenient_reward(PERFECT, TRUTH)[0] == 1.0 and strict_score(PERFECT, TRUTH) == 1.0
    assert lenient_reward(_with(decision="release"), TRUTH)[1]["field_acc/decision"] == 0.0


# --- data ------------------------------------------------------------------------------

def test_committed_files_are_exactly_what_the_seed_generates():
    files = generate(SEED)
    assert files == generate(SEED)
    assert files != generate(SEED + 1)
    for rel, text in files.items():
        assert (PACKAGE_DIR / rel).read_bytes() == text.encode("utf-8"), rel


def test_split_sizes_ids_and_disjoint_aircraft():
    for split, size in SPLIT_SIZES.items():
        rows = load_instances(split)
        assert len(rows) == size and {row["split"] for row in rows} == {split}
    assert (len(ALL), *SPLIT_SIZES.values()) == (150, 100, 25, 25)
    assert len({row["id"] for row in ALL}) == len(ALL)
    tails = [row["data"]["tail_number"] for row in ALL]
    assert len(set(tails)) == len(tails)
    assert not {example_instance(name)["data"]["tail_number"] for name in EXAMPLE_STATES} & set(tails)
    with pytest.raises(ValueError, match="'dev'"):
        load_instances("dev")


def test_labels_vary_so_no_constant_answer_scores_well():
    for field in FIELDS:
        values = [row["ground_truth"][field] for row in load_instances("train")]
        assert len(set(values)) == 2, field
    answers = [json.dumps(row["ground_truth"], sort_keys=True) for row in ALL]
    most_common = max(answers.count(a) for a in set(answers))
    assert most_common / len(ALL) <= 0.25


def test_every_ground_truth_follows_from_the_tools_by_the_sop():
    for row in [*ALL, *(example_instance(name) for name in EXAMPLE_STATES)]:
        episode = solve(row)
        assert episode.answer == row["ground_truth"], row["id"]
        final = episode.messages[-1]["content"]
        assert strict_score(final, row["ground_truth"]) == 1.0
        called = [m["tool_calls"][0]["function"]["name"] for m in episode.messages if m.get("tool_calls")]
        assert called == list(SOP_ORDER)


# --- tools -----------------------------------------------------------------------------

def test_checks_are_deterministic_one_line_key_values():
    tail = ALL[0]["data"]["tail_number"]
    session = InspectionSession()
    for name in CHECKS:
        first = dispatch(session, name, {"tail_number": tail})
        assert first == session.call(name, json.dumps({"tail_number": tail})) == CHECKS[name](tail)
        assert first == InspectionSession().call(name, {"tail_number": tail})  # no state in a check's result
        assert "\n" not in first and f"tail={tail}" in first
        assert all("=" in word for word in first.split()), first
    assert session.call("validate_aircraft", {"tail_number": f" {tail.lower()} "}) == CHECKS["validate_aircraft"](tail)


def test_the_report_files_the_checks_this_session_made_as_answer_json():
    row = ALL[0]
    tail, truth = row["data"]["tail_number"], row["ground_truth"]
    session = InspectionSession()
    empty = session.call("file_report", {"tail_number": tail})
    assert empty.startswith("report_id=RPT-") and "findings={} " in empty  # nothing checked yet
    session.call("inspect_mechanical", {"tail_number": tail})
    session.call("validate_aircraft", {"tail_number": tail.lower()})
    session.call("check_incidents", {"tail_number": "N000ZZ"})  # an error files nothing
    partial = session.call("file_report", {"tail_number": tail})
    findings = json.loads(partial.split("findings=", 1)[1].rsplit(" next=", 1)[0])
    assert list(findings) == ["aircraft_valid", "mechanical_status"]  # the SOP's order, not the call order
    assert findings == {k: truth[k] for k in findings}
    assert InspectionSession().call("file_report", {"tail_number": tail}) == empty  # sessions share nothing
    # the reference episode's report holds all five findings, exactly as the answer writes them
    report = [m["content"] for m in solve(row).messages if m["role"] == "tool"][-1]
    answer = {k: v for k, v in truth.items() if k != "decision"}
    assert report.split("findings=", 1)[1].startswith(json.dumps(answer))
    assert json.dumps(answer)[:-1] in format_answer(truth)


def test_each_tool_names_the_next_sop_step():
    tail = ALL[0]["data"]["tail_number"]
    episode = solve(ALL[0])
    results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    hints = [result.split()[-1] for result in results]
    assert hints == [f"next={name}" for name in SOP_ORDER[1:]] + ["next=<final_output>"]
    assert "Step 1: validate_aircraft" in ALL[0]["prompt"] and tail in ALL[0]["prompt"]


@pytest.mark.parametrize(
    "name, arguments, message",
    [
        ("inspect_mechanical", {"tail_number": "N000ZZ"}, "unknown tail_number 'N000ZZ'"),
        ("validate_aircraft", {"tail_number": 482}, "tail_number must be a non-empty string"),
        ("validate_aircraft", {"tail_number": ""}, "tail_number must be a non-empty string"),
        ("inspect_engine", {"tail_number": "N100EX"}, "unknown tool 'inspect_engine'"),
        ("check_incidents", "{not json", "not valid JSON"),
        ("check_incidents", "[1]", "must be a JSON object"),
        ("check_incidents", {}, "bad arguments for check_incidents"),
        ("check_incidents", {"tail_number": "N100EX", "year": 2020}, "bad arguments"),
        ("file_report", {"tail_number": "N100EX", "decision": "ground"}, "bad arguments for file_report"),
    ],
)
def test_bad_tool_input_returns_an_error_string(name, arguments, message):
    result = dispatch(InspectionSession(), name, arguments)
    assert isinstance(result, str) and result.startswith("error:") and message in result


def test_direct_calls_with_unknown_keys_return_errors_too():
    assert CHECKS["get_maintenance_record"]("N999XX").startswith("error: unknown tail_number")
    assert InspectionSession().tools["file_report"]("N999XX").startswith("error: unknown tail_number")


def test_tool_specs_match_the_functions():
    tools = InspectionSession().tools
    assert [spec["function"]["name"] for spec in TOOL_SPECS] == list(tools) == list(SOP_ORDER)
    for spec in TOOL_SPECS:
        tool = tools[spec["function"]["name"]]
        params = spec["function"]["parameters"]
        assert list(params["properties"]) == list(inspect.signature(tool).parameters) == params["required"]
        assert all(p["type"] == "string" and p["description"] for p in params["properties"].values())
        assert spec["function"]["description"]


# --- prompts ---------------------------------------------------------------------------

def test_build_messages_with_and_without_the_worked_example():
    row = load_instances("test")[0]
    plain = build_messages(row, with_examples=False)
    assert [m["role"] for m in plain] == ["system", "user"] and plain[-1]["content"] == row["prompt"]
    assert "validate_aircraft" in plain[0]["content"] and "<final_output>" in plain[0]["content"]
    shown = build_messages(row, with_examples=True)
    assert shown[0] == plain[0] and shown[-1] == plain[-1]
    example = shown[1:-1]
    assert example[0]["role"] == "user" and example[-1]["role"] == "assistant"
    assert sum(1 for m in example if m["role"] == "tool") == len(SOP_ORDER)
    assert all(not m["content"].startswith("error:") for m in example if m["role"] == "tool")
    assert strict_score(example[-1]["content"], example_instance()["ground_truth"]) == 1.0
    assert row["data"]["tail_number"] not in json.dumps(example)


def test_the_worked_example_numbers_its_steps():
    example = build_messages(load_instances("test")[0])[2:-1]
    lines = [m["content"].splitlines()[0] for m in example if m["role"] == "assistant"]
    assert lines == [f"Step {i}: {name}" for i, name in enumerate([*SOP_ORDER, "answer"], start=1)]
    assert example[-1]["content"].splitlines()[1].startswith("<final_output>")


def test_field_set_shapes_the_prompt_and_the_example_answer():
    row = load_instances("val")[0]
    three = FIELD_SETS["three"]
    messages = build_messages(row, with_examples=True, fields=three)
    answer = parse_final_output(messages[-2]["content"])
    assert list(answer) == list(three)
    keys_line = messages[0]["content"].splitlines()[-1]
    assert "decision" in keys_line and "aircraft_valid" not in keys_line
    with pytest.raises(ValueError, match="no prompt"):
        build_messages({"id": "x"}, with_examples=False)


def test_the_example_knob_picks_the_worked_example():
    row = load_instances("test")[0]
    for name in EXAMPLE_STATES:
        messages = build_messages(row, with_examples=True, example=name)
        truth = example_instance(name)["ground_truth"]
        assert truth["decision"] == name
        assert strict_score(messages[-2]["content"], truth) == 1.0
    assert build_messages(row) == build_messages(row, example="ground")
    with pytest.raises(ValueError, match="unknown example 'hard'"):
        build_messages(row, example="hard")


# --- the answer-step probe ---------------------------------------------------------------

def test_probe_scores_every_field_of_every_row_with_a_real_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.aircraft_inspection.probe import _hide_findings, probe
    from mtrl_runtime.chat import ChatRenderer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    rows = load_instances("val")[:2]
    found = probe(model, renderer, rows)
    assert sum(len(v) for v in found.values()) == 2 * len(FIELDS)
    assert {name for name, _ in found} == set(FIELDS)
    assert all(0.0 < p < 1.0 for v in found.values() for p in v)
    hidden = _hide_findings(list(solve(rows[0]).messages))
    assert "findings=" not in hidden[-2]["content"] and hidden[-2]["content"].startswith("report_id=RPT-")
    assert "findings=" in solve(rows[0]).messages[-2]["content"]
