"""``mtrl collect --teacher-url``: a frontier teacher drives the same agent; its successes become ``mtrl sft`` data.

The teacher is a stand-in behind its own endpoint: a second real coordinator
on 127.0.0.1 (inference mode, an API key required) whose scripted engine
solves the task (``lookup`` A1, then ``ANSWER 42``) except on task ``t-1``,
where it answers wrong. It speaks every served protocol, so the teacher is
called over OpenAI chat completions and over Anthropic Messages. The agent is
the plain OpenAI-client tool loop of ``_eval_agents``; the student is the
tiny Llama, whose chat format ``mtrl sft`` renders the conversations in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.testing import free_port
from mtrl_runtime.types import GenerationRequest

KEY_ENV = "MTRL_TEST_TEACHER_KEY"
KEY = "sk-teacher-test"
TASKS = [{"id": f"t-{n}", "prompt": f"task {n}: what is the value of A1?", "ground_truth": 42, "split": "train"}
         for n in range(3)]


class Teacher:
    """Look A1 up, then answer from the tool's result; on task 1 answer wrong at once."""

    def __call__(self, request: GenerationRequest, prompt: str) -> Any:
        if "task 1:" in prompt:
            return "ANSWER 7"
        if "<tool_response>" in prompt:
            return "ANSWER 42"
        return ScriptedReply.tool_call("lookup", {"key": "A1"})


@pytest.fixture
def teacher(served, tiny_tok, monkeypatch) -> Any:
    cfg = MtrlConfig.from_dict({"core": {"model": "teacher-1"},
                                "advanced": {"server": {"inference_mode": True, "api_key": KEY}}})
    monkeypatch.setenv(KEY_ENV, KEY)
    return served(ScriptedEngine(tiny_tok, Teacher()), cfg)


def inputs(tmp_path: Path, model_dir: Path) -> tuple[Path, list[str]]:
    """The student's config (scripted engine: the policy would answer ANSWER 7) and the collect arguments."""
    cfg = {"core": {"engine": "scripted", "model": str(model_dir), "run_dir": str(tmp_path / "run"),
                    "group_size": 2, "max_turns": 3, "sampling_params": {"max_tokens": 48}},
           "advanced": {"engine_options": {"script": ["ANSWER 7"]}, "rollout_timeout_s": 30, "lora_target_modules":
                        ["q_proj", "v_proj"]}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return tmp_path / "cfg.yaml", [str(tmp_path / "cfg.yaml"), "--agent", "_eval_agents:agent",
                                   "--dataset", str(tmp_path / "tasks.jsonl"), "-n", "3"]


@pytest.mark.parametrize("protocol, suffix", [("openai", "/v1"), ("anthropic", "")])
def test_teacher_successes_become_sft_data_in_the_student_chat_format(tmp_path, tiny_model_dir, teacher, capsys,
                                                                       protocol, suffix):
    from mtrl_runtime.cli import main
    from mtrl_runtime.engines import load_tokenizer
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.warmstart import conversation_demonstrations, conversation_renderer, importer

    cfg, common = inputs(tmp_path, tiny_model_dir)
    assert main(["collect", *common, "--teacher-url", teacher.url + suffix, "--teacher-model", "teacher-1",
                 "--teacher-protocol", protocol, "--teacher-api-key-env", KEY_ENV,
                 "--strict", "_eval_agents:strict_answer"]) == 0
    out = capsys.readouterr().out
    assert f"with the teacher teacher-1 at {teacher.url + suffix}" in out
    # 6 rollouts, the 2 of task t-1 failed by the strict scorer; the 4 others written
    assert "4 rollouts kept; left out: 2 failed by the strict scorer" in out, out
    data = tmp_path / "run" / "teacher_sft.jsonl"
    assert f"4 conversations of 4 rollouts written to {data}" in out
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(lines) == 4
    for line in lines:  # the teacher's whole episode: the call, the tool's result, the answer
        roles = [m["role"] for m in line["messages"]]
        assert roles[-4:] == ["user", "assistant", "tool", "assistant"], roles
        call = line["messages"][-3]["tool_calls"][0]["function"]
        assert call["name"] == "lookup" and json.loads(call["arguments"]) == {"key": "A1"}
        assert line["messages"][-1]["content"] == "ANSWER 42"
        assert line["tools"][0]["function"]["name"] == "lookup"
        assert "t-1" not in json.dumps(line) and "task 1:" not in json.dumps(line)
    assert KEY not in data.read_text()

    # the store holds the teacher's turns: named by its model, without token ids (never trained on as RL data)
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        turns = [t for r in store.rollouts() for t in store.get_rollout(r.id).turns]
    finally:
        store.close()
    assert turns and all(t.model == "teacher-1" and not t.completion_ids for t in turns)

    # cross-tokenizer: the conversation is rendered by the student's own chat format, the loss on the replies
    renderer = conversation_renderer(load_tokenizer(tiny_model_dir), None, "extend")
    demos = conversation_demonstrations(renderer, importer("openai")(data))
    tokenizer = load_tokenizer(tiny_model_dir)
    for demo in demos:
        trained = [tok for s in demo.samples for tok, m in zip(s.token_ids_T, s.loss_mask_T) if m]
        assert "ANSWER 42" in tokenizer.decode(trained)

    # then mtrl sft trains the student on them
    assert main(["sft", str(cfg), "--conversations", str(data), "--out", str(tmp_path / "sft"), "--epochs", "1",
                 "--held-out", "0.25", "--lr", "1e-3"]) == 0
    assert (tmp_path / "sft" / "adapter" / "adapter_config.json").is_file()
    assert re.search(r"(\d+) demonstrations to train on", capsys.readouterr().out)


@pytest.mark.parametrize("flags, message", [
    (["--teacher-url", "http://127.0.0.1:1/v1"], "--teacher-url needs --teacher-model too"),
    (["--teacher-model", "m", "--strict", "_eval_agents:strict_answer"], "--teacher-model needs --teacher-url too"),
    (["--strict", "_eval_agents:strict_answer"], "--strict selects a teacher's rollouts; give --teacher-url"),
    (["--teacher-url", "http://127.0.0.1:1/v1", "--teacher-model", "m"], "give --strict module:function and/or"),
    (["--teacher-url", "localhost:8000", "--teacher-model", "m", "--min-reward", "1"],
     "--teacher-url: reference url: expected an http(s) base URL"),
    (["--teacher-url", "http://127.0.0.1:1/v1", "--teacher-model", "m", "--min-reward", "1",
      "--teacher-api-key-env", "MTRL_TEST_UNSET_VARIABLE"],
     "--teacher-api-key-env: reference api_key_env: the environment variable MTRL_TEST_UNSET_VARIABLE is not set"),
    (["--teacher-url", "http://127.0.0.1:1/v1", "--teacher-model", "m", "--strict", "_eval_agents:nothing_here"],
     "--strict: "),
])
def test_bad_teacher_flags_are_named_before_any_rollout(tmp_path, flags, message, monkeypatch):
    from mtrl_runtime.cli import main

    monkeypatch.delenv("MTRL_TEST_UNSET_VARIABLE", raising=False)
    _, common = inputs(tmp_path, tmp_path / "no-model")
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["collect", *common, *flags])
    assert not (tmp_path / "run" / "trajectories.db").exists()


def test_an_unreachable_teacher_fails_at_once_naming_the_url(tmp_path, tiny_model_dir):
    from mtrl_runtime.cli import main

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    _, common = inputs(tmp_path, tiny_model_dir)
    with pytest.raises(SystemExit, match=re.escape(f"--teacher-url: reference url: cannot reach {url}")):
        main(["collect", *common, "--teacher-url", url, "--teacher-model", "m", "--min-reward", "1"])
