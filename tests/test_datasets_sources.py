"""Tasks from the datasets users have: parquet, Arrow, JSON, CSV, ``save_to_disk`` folders, Dataset objects.

Each file is written here with the library users write it with (pyarrow,
pandas, ``datasets``), read back with ``load_tasks``, and compared with the
Tasks of the same rows as JSONL. Then SageMaker AI MTRL's parquet row shape
(verl's: ``prompt`` as chat messages, ``reward_model.ground_truth``,
``extra_info``), bad rows listed with their index and field, the errors of
a missing file, an unknown format or split, and ``mtrl collect`` on a
parquet dataset end to end (scripted engine, real loopback HTTP).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.executors import task_instance  # noqa: E402
from mtrl_runtime.rollouts import load_tasks  # noqa: E402
from mtrl_runtime.task_sources import MAX_LISTED, DatasetError  # noqa: E402
from mtrl_runtime.types import Task  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

# One shape for every row, as a columnar file needs (a column has one type); the messages differ in their keys
# (``name`` only in the second), which a columnar file fills with null and the loader leaves out again.
ROWS = [
    {"id": "q1", "prompt": "What is 6 x 7?", "messages": None, "ground_truth": {"answer": "42"}, "split": "train",
     "data": {"tail": "N1", "level": 1}, "source": "gsm"},
    {"id": "q2", "prompt": None,
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Add 2 and 3.", "name": "ann"}],
     "ground_truth": {"answer": "5"}, "split": "test", "data": {"tail": "N2", "level": 2}, "source": "gsm"},
    {"id": "q3", "prompt": "Say anything.", "messages": None, "ground_truth": {"answer": "x"}, "split": "train",
     "data": {"tail": "N3", "level": 3}, "source": "misc"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({k: v for k, v in row.items() if v is not None}) + "\n" for row in rows))
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def expected(tmp_path) -> list[Task]:
    return load_tasks(_jsonl(tmp_path / "tasks.jsonl", ROWS))


def test_the_jsonl_baseline_is_what_the_rows_say(expected):
    assert [t.id for t in expected] == ["q1", "q2", "q3"]
    assert expected[0].prompt == "What is 6 x 7?" and expected[0].messages is None
    assert expected[1].messages[1] == {"role": "user", "content": "Add 2 and 3.", "name": "ann"}
    assert expected[1].split == "test" and expected[0].ground_truth == {"answer": "42"}
    assert expected[0].data == {"tail": "N1", "level": 1, "source": "gsm"}


def test_parquet_arrow_json_and_saved_datasets_give_the_jsonl_tasks(tmp_path, expected):
    dataset = datasets.Dataset.from_list(ROWS)
    sources = {"parquet": _parquet(tmp_path / "tasks.parquet", ROWS)}
    dataset.to_parquet(str(tmp_path / "hf.parquet"))
    sources["Dataset.to_parquet"] = tmp_path / "hf.parquet"
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    sources["json array"] = tmp_path / "rows.json"
    dataset.to_json(str(tmp_path / "lines.json"))  # JSON lines, as datasets writes them
    sources["Dataset.to_json"] = tmp_path / "lines.json"
    dataset.save_to_disk(str(tmp_path / "saved"))
    sources["save_to_disk Dataset"] = tmp_path / "saved"
    [shard] = sorted((tmp_path / "saved").glob("*.arrow"))  # the Arrow IPC stream datasets writes
    sources["arrow stream"] = shard
    with pa.ipc.new_file(str(tmp_path / "file.arrow"), pa.Table.from_pylist(ROWS).schema) as writer:
        writer.write_table(pa.Table.from_pylist(ROWS))
    sources["arrow file"] = tmp_path / "file.arrow"
    for name, path in sources.items():
        assert load_tasks(path) == expected, name
        assert load_tasks(str(path)) == expected, name
    assert load_tasks(dataset) == expected  # in memory
    dataset.set_format("numpy")  # numpy arrays and scalars come back as plain JSON
    assert load_tasks(dataset) == expected
    assert all(type(t.data["level"]) is int for t in load_tasks(dataset))


def test_a_saved_dataset_dict_takes_the_split_named_after_the_path(tmp_path, expected):
    train = datasets.Dataset.from_list([r for r in ROWS if r["split"] == "train"])
    test = datasets.Dataset.from_list([{**r, "split": None} for r in ROWS if r["split"] == "test"])
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    assert load_tasks(f"{tmp_path / 'dd'}::train") == [t for t in expected if t.split == "train"]
    # rows without a split column value get the DatasetDict's split name
    assert load_tasks(f"{tmp_path / 'dd'}::test") == [t for t in expected if t.split == "test"]
    with pytest.raises(DatasetError, match=r"holds the splits \['train', 'test'\]; pick one: '.*dd::train'"):
        load_tasks(tmp_path / "dd")
    with pytest.raises(DatasetError, match=r"has no split 'val'; its splits: \['train', 'test'\]"):
        load_tasks(f"{tmp_path / 'dd'}::val")
    with pytest.raises(DatasetError,
                       match=r"holds the splits \['train', 'test'\]; pick one: load_tasks\(dataset\['train'\]\)"):
        load_tasks(datasets.DatasetDict({"train": train, "test": test}))
    assert load_tasks(datasets.DatasetDict({"test": test}))[0].split == "test"  # one split: no choice to make


def test_path_split_on_a_file_keeps_the_rows_of_that_split(tmp_path, expected):
    path = _parquet(tmp_path / "all.parquet", ROWS)
    assert load_tasks(f"{path}::test") == [expected[1]]
    with pytest.raises(DatasetError, match=r"no task has split 'val'; the splits present: \['test', 'train'\]"):
        load_tasks(f"{path}::val")


def test_pandas_rows_and_dataframes_become_plain_json(tmp_path, expected):
    import pandas as pd

    frame = pd.read_parquet(_parquet(tmp_path / "tasks.parquet", ROWS))
    records = frame.to_dict("records")
    assert type(records[1]["messages"]).__module__ == "numpy"  # what pandas hands out for a list column
    assert load_tasks(records) == expected
    assert load_tasks(frame) == expected


def test_csv_cells_are_text_as_written(tmp_path):
    (tmp_path / "t.csv").write_text('id,prompt,ground_truth,split,code\n'
                                    'a,"Say ""hi""\nthen stop",007,train,x1\n'
                                    'b,Add 2 and 3.,5,test,\n')
    jsonl = _jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "prompt": 'Say "hi"\nthen stop', "ground_truth": "007", "split": "train", "code": "x1"},
        {"id": "b", "prompt": "Add 2 and 3.", "ground_truth": "5", "split": "test", "code": ""}])
    assert load_tasks(tmp_path / "t.csv") == load_tasks(jsonl)
    (tmp_path / "bad.csv").write_text("id,prompt\na,one\nb,two,extra\nc,three\nd\n")
    with pytest.raises(DatasetError) as err:
        load_tasks(tmp_path / "bad.csv")
    text = str(err.value)
    assert "2 bad rows of 4" in text, text
    assert "row 1: 3 cells where the header names 2 columns" in text and "row 3: 1 cells" in text, text
    (tmp_path / "dup.csv").write_text("id,prompt,id\na,b,c\n")
    with pytest.raises(DatasetError, match=r"header row: the columns \['id'\] appear more than once"):
        load_tasks(tmp_path / "dup.csv")


SAGEMAKER_ROWS = [
    {"data_source": "openai/gsm8k", "agent_name": "tool_agent", "ability": "math",
     "prompt": [{"role": "system", "content": "Use the calculator tool."},
                {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many?"}],
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "answer": "48 + 24 = 72",
                    "tools_kwargs": {"calc": {"create_kwargs": {"ground_truth": "72"}}}}},
    {"data_source": "openai/gsm8k", "agent_name": "tool_agent", "ability": "math",
     "prompt": [{"role": "system", "content": "Use the calculator tool."},
                {"role": "user", "content": "Weng earns $12 an hour for 50 minutes. How much?"}],
     "reward_model": {"style": "rule", "ground_truth": "10"},
     "extra_info": {"split": "test", "index": 1, "answer": "12 * 50 / 60 = 10",
                    "tools_kwargs": {"calc": {"create_kwargs": {"ground_truth": "10"}}}}},
]


def test_sagemaker_prompts_parquet_maps_every_field(tmp_path):
    path = _parquet(tmp_path / "prompts.parquet", SAGEMAKER_ROWS)
    first, second = load_tasks(path)
    assert first.id == "task-0" and second.id == "task-1"
    assert first.prompt is None and first.messages == tuple(SAGEMAKER_ROWS[0]["prompt"])
    assert (first.ground_truth, second.ground_truth) == ("72", "10")  # reward_model.ground_truth
    assert (first.split, second.split) == ("train", "test")  # extra_info.split
    # nothing dropped: every column is in data under its own name, the list prompt too
    assert first.data == SAGEMAKER_ROWS[0]
    # an agent server written for SageMaker gets the row it would get there
    instance = task_instance(first)
    assert {k: instance[k] for k in SAGEMAKER_ROWS[0]} == SAGEMAKER_ROWS[0]
    assert instance["messages"] == SAGEMAKER_ROWS[0]["prompt"] and instance["ground_truth"] == "72"
    assert load_tasks(f"{path}::test") == [second]
    # the same rows through pandas (numpy arrays inside structs) and a string prompt, as SageMaker also allows
    import pandas as pd

    assert load_tasks(pd.read_parquet(path)) == [first, second]
    plain = [{**row, "prompt": row["prompt"][1]["content"]} for row in SAGEMAKER_ROWS]
    [task, _] = load_tasks(_parquet(tmp_path / "plain.parquet", plain))
    assert task.prompt == plain[0]["prompt"] and task.messages is None and "prompt" not in task.data


def test_bad_rows_are_all_listed_with_index_and_field_and_nothing_loads(tmp_path):
    rows = [
        {"id": "a", "prompt": "fine", "messages": None, "reward_model": None, "ground_truth": None},
        {"id": "b", "prompt": None, "messages": None, "reward_model": None, "ground_truth": None},
        {"id": "c", "prompt": None, "messages": [{"role": None, "content": "hi"}], "reward_model": None,
         "ground_truth": None},
        {"id": "a", "prompt": "again", "messages": None, "reward_model": None, "ground_truth": None},
        {"id": "e", "prompt": "x", "messages": None, "reward_model": {"ground_truth": "1"}, "ground_truth": "2"},
    ]
    with pytest.raises(DatasetError) as err:
        load_tasks(_parquet(tmp_path / "bad.parquet", rows))
    text = str(err.value)
    assert text.startswith(f"dataset '{tmp_path / 'bad.parquet'}': 4 bad rows of 5"), text
    assert "row 1: needs a 'prompt' or 'messages' field (absent or null here); its columns: [" in text, text
    assert "row 2: messages[0].role: expected a non-empty string, got null" in text, text
    assert "row 3: id: task id 'a' appears more than once (first at row 0)" in text, text
    assert "row 4: reward_model.ground_truth: differs from the ground_truth column" in text, text
    assert [p.index for p in err.value.problems] == [1, 2, 3, 4]

    many = [{"id": f"t{i}", "prompt": None if i % 2 else "ok"} for i in range(2 * (MAX_LISTED + 5))]
    with pytest.raises(DatasetError) as err:
        load_tasks(many)
    text = str(err.value)
    assert f"{MAX_LISTED + 5} bad rows of {len(many)}" in text and "... and 5 more bad rows" in text, text
    assert text.count("needs a 'prompt'") == MAX_LISTED

    (tmp_path / "bad.jsonl").write_text('{"id": "a", "prompt": "1"}\nnot json\n\n{"id": "c", "prompt": 3}\n')
    with pytest.raises(DatasetError) as err:
        load_tasks(tmp_path / "bad.jsonl")
    assert "row 1: line 2 is not JSON" in str(err.value)
    assert "row 2 (line 4): prompt: expected a string or a list of chat messages, got int 3" in str(err.value)


def test_values_without_a_json_form_are_bad_rows_and_dates_become_iso_text(tmp_path):
    import datetime as dt

    table = pa.table({"id": ["a", "b"], "prompt": ["p", "q"], "blob": [b"\x00", None],
                      "when": [dt.datetime(2025, 3, 1, 12, 30), dt.datetime(2025, 3, 2)]})
    pq.write_table(table, tmp_path / "typed.parquet")
    with pytest.raises(DatasetError, match=r"row 0: blob: a builtins.bytes \(b'\\x00'\) has no JSON form; cast"):
        load_tasks(tmp_path / "typed.parquet")
    pq.write_table(table.drop_columns(["blob"]), tmp_path / "dates.parquet")
    assert [t.data["when"] for t in load_tasks(tmp_path / "dates.parquet")] == ["2025-03-01T12:30:00",
                                                                               "2025-03-02T00:00:00"]


def test_source_errors_name_the_path_and_the_choices(tmp_path):
    with pytest.raises(DatasetError, match=r"dataset '.*missing.parquet': no such file or folder"):
        load_tasks(tmp_path / "missing.parquet")
    (tmp_path / "tasks.txt").write_text("{}")
    with pytest.raises(DatasetError, match=r"unknown format '.txt'; known: .arrow, .csv, .json, .jsonl, .parquet, "
                                           r"a folder written by save_to_disk"):
        load_tasks(tmp_path / "tasks.txt")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetError, match="is a folder, but not one written by save_to_disk"):
        load_tasks(tmp_path / "plain")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="cannot be read as parquet"):
        load_tasks(tmp_path / "broken.parquet")
    with pytest.raises(DatasetError, match="expected PATH or PATH::SPLIT"):
        load_tasks("tasks.parquet::")
    with pytest.raises(DatasetError, match=r"holds no tasks"):
        load_tasks(_jsonl(tmp_path / "empty.jsonl", []))


def test_core_dataset_takes_a_source_and_refuses_a_malformed_one():
    assert MtrlConfig.coerce({"core": {"dataset": "data/prompts.parquet::train"}}).core.dataset.endswith("::train")
    with pytest.raises(ValueError, match=r"core.dataset.*expected PATH or PATH::SPLIT"):
        MtrlConfig.coerce({"core": {"dataset": "::train"}})


def test_a_jsonl_load_imports_neither_pyarrow_nor_datasets(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", ROWS)
    code = ("import sys\nfrom mtrl_runtime.task_sources import read_tasks\n"
            f"assert len(read_tasks({str(path)!r})) == 3\n"
            "assert not {'pyarrow', 'datasets', 'pandas', 'numpy'} & set(sys.modules), sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


SCRIPT = """\
tasks:
  - match: "value under A1"
    replies:
      - tool_call: {name: lookup, arguments: {key: A1}}
      - "ANSWER 42"
  - replies: ["ANSWER 0"]
"""


def _collect_inputs(tmp_path: Path, model_dir: Path) -> tuple[Path, Path]:
    cfg = {"core": {"engine": "scripted", "model": str(model_dir), "run_dir": str(tmp_path / "run"),
                    "group_size": 2, "max_turns": 4},
           "advanced": {"rollout_timeout_s": 30}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "script.yaml").write_text(SCRIPT)
    return tmp_path / "cfg.yaml", tmp_path / "script.yaml"


def test_mtrl_collect_runs_on_a_parquet_dataset(tmp_path, tiny_model_dir, capsys):
    from mtrl_runtime.cli import main
    from mtrl_runtime.store import open_store

    cfg, script = _collect_inputs(tmp_path, tiny_model_dir)
    rows = [{"id": "look", "prompt": "What is the value under A1?", "split": "train"},
            {"id": "other", "prompt": "Say anything.", "split": "train"},
            {"id": "held", "prompt": "Not in the train split.", "split": "test"}]
    data = _parquet(tmp_path / "tasks.parquet", rows)
    assert main(["collect", str(cfg), "--agent", "_collect_agent:agent", "--dataset", f"{data}::train",
                 "--script", str(script)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if not line.startswith("mtrl:")]
    assert len(lines) == 4, out  # 2 train tasks x group_size 2
    look = [x for x in lines if x.startswith("look ")]
    assert len(look) == 2 and all("completed  turns=2  tool_calls=1 [lookup]  reward=1.000" in x for x in look), out
    assert "mtrl: 4 rollouts (4 completed)" in out
    store = open_store(tmp_path / "run" / "trajectories.db")
    try:
        rollouts = store.rollouts(with_turns=True)
        assert {r.task_id for r in rollouts} == {"look", "other"}
        assert all(len(t.completion_ids) == len(t.logprobs) > 0 for r in rollouts for t in r.turns)
    finally:
        store.close()


def test_mtrl_collect_refuses_a_dataset_with_bad_rows_before_any_rollout(tmp_path, tiny_model_dir, capsys):
    from mtrl_runtime.cli import main

    cfg, script = _collect_inputs(tmp_path, tiny_model_dir)
    data = _parquet(tmp_path / "bad.parquet", [{"id": "a", "prompt": "ok"}, {"id": "b", "prompt": None},
                                               {"id": "c", "prompt": None}])
    assert main(["collect", str(cfg), "--agent", "_collect_agent:agent", "--dataset", str(data),
                 "--script", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mtrl collect: dataset '{data}': 2 bad rows of 3"), err
    assert "row 1: needs a 'prompt' or 'messages' field" in err and "row 2: needs" in err, err
    assert not (tmp_path / "run" / "trajectories.db").exists()
    assert main(["collect", str(cfg), "--agent", "_collect_agent:agent", "--dataset", f"{data}.csv"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    # train, eval and the checks load their tasks the same way, before any engine or rollout
    for command in (["train", "--no-mlflow"], ["eval", "--no-mlflow"], ["check", "env"], ["check", "reward"]):
        argv = [*command, str(cfg), "--agent", "_collect_agent:agent", "--dataset", str(data)]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"mtrl {command[0]}: dataset '{data}': 2 bad rows of 3" in err, (argv, err)
    assert not (tmp_path / "run" / "trajectories.db").exists()
