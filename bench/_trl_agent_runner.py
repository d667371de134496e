"""TRL's GRPOTrainer on the aircraft inspection task, one step at a time on command: the TRL side of
``bench/agent_vs_trl.py``.

Runs in the separate TRL environment (``.venv-trl``), never in mtrl's. The
task is written the way TRL's docs teach a multi-turn agent: an environment
class passed as ``environment_factory`` whose public methods are the tools
(type hints and Google-style docstrings make their schemas), ``reset`` taking
the dataset row, and a reward function over the completions with the row's
columns as keyword arguments. The tools, the prompts (SOP, worked example,
request) and the reward are the example's own modules
(``examples/aircraft_inspection``: pure Python, no mtrl import).

Protocol with the parent (as ``bench/_trl_runner.py``, whose step loop it
reuses): a ``{"ready": ...}`` line, then per ``go`` line one step and one JSON
line of its figures; ``save PATH`` (between steps) writes the LoRA adapter
there as a peft folder and answers ``{"saved": PATH}``; ``stop`` ends it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]

from _trl_runner import StepClock, _protocol_stream, grpo_config, lora_config, run_steps  # noqa: E402

from examples.aircraft_inspection.prompts import build_messages  # noqa: E402
from examples.aircraft_inspection.reward import FIELD_SETS, FIELDS, reward  # noqa: E402
from examples.aircraft_inspection.tools import SOP_ORDER, InspectionSession  # noqa: E402


def _tool_method(name: str) -> Any:
    """A method calling the session's tool ``name``, with that tool's own name, docstring and signature."""
    tool = InspectionSession().tools[name]

    def method(self, tail_number: str) -> str:  # noqa: ANN001 (an annotated self would become a tool argument)
        return self.session.call(name, {"tail_number": tail_number})

    method.__name__ = method.__qualname__ = name
    method.__doc__ = tool.__doc__  # the docstring mtrl's Strands agent makes its tool spec from
    return method


class AircraftInspectionEnv:
    """One episode's tools: the example's ``InspectionSession`` (read-only fixtures, keyed by tail number)."""

    def __init__(self) -> None:
        self.session = InspectionSession()

    def reset(self, **row: Any) -> None:
        self.session = InspectionSession()
        return None  # the prompt is the row's own messages; nothing to append


for _name in SOP_ORDER:  # the six tools as public methods: TRL offers an environment's public methods as tools
    setattr(AircraftInspectionEnv, _name, _tool_method(_name))


def final_text(completion: list[dict[str, Any]]) -> str:
    """The episode's answer: the last assistant message's text (mtrl's agent scores Strands' final text)."""
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


def inspection_reward(completions: list[list[dict[str, Any]]], ground_truth: list[dict[str, Any]],
                      fields: list[str], **_: Any) -> list[float]:
    """The example's dense per-field reward on each episode's final answer."""
    return [reward(final_text(c), truth, tuple(f))[0] for c, truth, f in zip(completions, ground_truth, fields)]


def dataset_rows(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conversational prompts: the messages mtrl's agent sends (SOP, worked example, request)."""
    rows = []
    for task in tasks:
        data = task.get("data") or {}
        fields = list(FIELD_SETS[data["fields"]]) if "fields" in data else list(FIELDS)
        rows.append({"prompt": build_messages(task, with_examples=True, fields=fields),
                     "ground_truth": task["ground_truth"], "fields": fields})
    return rows


def build_trainer(setup: dict[str, Any], output_dir: str) -> Any:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    torch.set_num_threads(setup["threads"])
    tokenizer = AutoTokenizer.from_pretrained(setup["model"], padding_side="left")
    # SmolLM2's own template has no tools: both sides render with mtrl's Hermes-style ChatML template, and TRL
    # parses replies with its Hermes (<tool_call> JSON) response template, set by hand as TRL's docs say to do
    # for a template add_response_schema does not know.
    tokenizer.chat_template = setup["chat_template"]
    tokenizer.response_template = qwen3_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = grpo_config(
        setup, output_dir,
        gradient_checkpointing=False,  # mtrl's config runs without it on this task
        # the step's episodes in micro-batches, one optimizer step for all of them (one generation batch)
        per_device_train_batch_size=setup["micro_batch"],
        gradient_accumulation_steps=setup["tasks_per_step"] * setup["group_size"] // setup["micro_batch"],
        max_completion_length=setup["max_completion_length"],
        max_tool_calling_iterations=setup["max_turns"] - 1,
        temperature=setup["temperature"],
    )
    return GRPOTrainer(model=setup["model"], reward_funcs=inspection_reward, args=args,
                       train_dataset=Dataset.from_list(dataset_rows(setup["tasks"])), processing_class=tokenizer,
                       peft_config=lora_config(setup), environment_factory=AircraftInspectionEnv)


class Commands:
    """Reads the parent's lines between steps: ``save PATH`` is answered at once, ``go`` starts the step."""

    def __init__(self, clock: StepClock, stdin: Any, trainer: Any) -> None:
        self.clock = clock
        self.stdin = stdin
        self.trainer = trainer

    def readline(self) -> str:
        while True:
            line = self.stdin.readline()
            if line.startswith("save "):
                path = line[5:].strip()
                self.trainer.model.save_pretrained(path)
                self.clock.send({"saved": path})
                continue
            return line


def main() -> None:
    out = _protocol_stream()
    setup = json.loads(sys.argv[1])
    os.environ.setdefault("OMP_NUM_THREADS", str(setup["threads"]))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    def started(trainer: Any, clock: StepClock) -> None:
        # StepClock.step_begin reads its go/stop line through sys.stdin.readline: save commands are answered first
        sys.stdin = Commands(clock, sys.stdin, trainer)

    run_steps(out, setup, build_trainer, "mtrl-bench-trl-agent-", started)


if __name__ == "__main__":
    main()
