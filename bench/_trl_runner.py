"""TRL's GRPOTrainer, one step at a time on command: the TRL side of ``bench/trl_vs_mtrl.py``.

Runs in the separate TRL environment (``.venv-trl``), never in mtrl's. The
parent passes the setup as one JSON argument and drives the steps over
stdin/stdout, so the two trainers take turns and never share the CPUs:

- before each step the runner waits for a line ``go`` on stdin (``stop``
  or end of input ends it);
- once the step is done (at the next step's start) it writes one JSON line
  with that step's figures; the first line it writes, before step 0, is
  ``{"ready": ...}``.

How a step is timed (``transformers.Trainer`` callbacks plus one wrapper):

- ``wall_s``: from the ``go`` line to the start of the next step: the
  generation, the reward, the training part and TRL's logging;
- ``generation_s``: the time in ``GRPOTrainer._prepare_inputs``, which
  generates the completions, scores them and computes the advantages;
- ``train_s``: ``on_step_begin`` to ``on_step_end`` less ``generation_s``:
  the policy forward, loss, backward, gradient clipping, optimizer step,
  scheduler step and ``zero_grad``;
- tokens: the prompt and completion tokens of the batch that
  ``_prepare_inputs`` returns (its attention masks; padding not counted).

TRL's own output goes to stderr; stdout carries only the JSON lines.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from importlib import metadata
from typing import Any, Callable


def _protocol_stream() -> Any:
    """A line-buffered handle on the real stdout; fd 1 and ``sys.stdout`` then point at stderr."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


class StepClock:
    """Times each step (see the module docstring) and reports it to the parent."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.go_at: float | None = None
        self.begin_at = 0.0
        self.generation_s = 0.0
        self.tokens = {"prompt": 0, "completion": 0, "padded": 0}
        self.pending: dict[str, Any] | None = None
        self.info: dict[str, Any] = {}  # sent with the ready line

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")

    def wrap_prepare_inputs(self, prepare: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            batch = prepare(*args, **kwargs)
            self.generation_s += time.perf_counter() - started
            prompt, completion = batch["prompt_mask"], batch["completion_mask"]
            self.tokens["prompt"] += int(prompt.sum())
            self.tokens["completion"] += int(completion.sum())
            self.tokens["padded"] += prompt.numel() + completion.numel()
            return batch

        return timed

    def step_begin(self, step: int) -> None:
        now = time.perf_counter()
        if self.pending is not None:
            self.pending["wall_s"] = now - self.go_at
            self.send(self.pending)
            self.pending = None
        elif self.go_at is None:
            self.send({"ready": True, "step": step, **self.info})
        command = sys.stdin.readline().strip()
        if command != "go":
            self.out.close()
            os._exit(0)  # the parent has what it needs; skip the trainer's teardown
        self.go_at = self.begin_at = time.perf_counter()
        self.generation_s = 0.0
        self.tokens = {"prompt": 0, "completion": 0, "padded": 0}

    def step_end(self, step: int) -> None:
        elapsed = time.perf_counter() - self.begin_at
        self.pending = {
            "step": step,
            "generation_s": self.generation_s,
            "train_s": elapsed - self.generation_s,
            "prompt_tokens": self.tokens["prompt"],
            "completion_tokens": self.tokens["completion"],
            "padded_tokens": self.tokens["padded"],
        }


def grpo_config(setup: dict[str, Any], output_dir: str, **own: Any) -> Any:
    """The GRPOConfig both TRL benches train with (CPU, the setup's precision, LoRA-friendly constant learning
    rate, no KL term, one optimizer step per batch (in ``gradient_accumulation_steps`` micro-batches where ``own``
    says so), no saving or reporting), plus each bench's ``own`` settings."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=setup["bf16"],
        model_init_kwargs={"dtype": setup["weights"]},  # float32 or bfloat16 base weights, as on mtrl's side
        num_generations=setup["group_size"],
        gradient_accumulation_steps=own.pop("gradient_accumulation_steps", 1),
        top_p=1.0,
        learning_rate=setup["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        max_steps=setup["steps"] + 1,  # one more: a step's figures are sent when the next one starts
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=setup["seed"],
        **own,
    )


def lora_config(setup: dict[str, Any]) -> Any:
    """LoRA on the setup's modules, rank and alpha, no dropout: mtrl's side's adapter."""
    from peft import LoraConfig

    return LoraConfig(r=setup["lora_rank"], lora_alpha=setup["lora_alpha"], lora_dropout=0.0,
                      target_modules=list(setup["target_modules"]), bias="none", task_type="CAUSAL_LM")


def build_trainer(setup: dict[str, Any], output_dir: str) -> Any:
    """A GRPOTrainer on the setup the parent gives (the same settings mtrl's side uses)."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    torch.set_num_threads(setup["threads"])
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in setup["prompts"]]

    def reward_length(completions: list[Any], **_: Any) -> list[float]:
        """The same reward as mtrl's agent: characters in the completion / 256."""
        return [len(c[0]["content"]) / 256 for c in completions]

    args = grpo_config(
        setup, output_dir,
        gradient_checkpointing=setup["gradient_checkpointing"],
        per_device_train_batch_size=setup["group_size"],
        max_completion_length=setup["max_tokens"],
        generation_kwargs={"min_new_tokens": setup["max_tokens"]},  # every completion is max_tokens long
        temperature=1.0,
    )
    return GRPOTrainer(
        model=setup["model"], reward_funcs=reward_length, args=args,
        train_dataset=Dataset.from_list(rows), peft_config=lora_config(setup),
    )


def run_steps(out: Any, setup: dict[str, Any], build: Callable[[dict[str, Any], str], Any], prefix: str,
              started: Callable[[Any, StepClock], None] | None = None) -> None:
    """Build the trainer and train it one step per ``go`` line, each step's figures (and peak RSS) sent to ``out``;
    ``started(trainer, clock)`` runs once the trainer is built."""
    import torch
    from transformers import TrainerCallback

    clock = StepClock(out)
    clock.info = {"versions": {name: metadata.version(name) for name in ("trl", "transformers", "peft", "torch")}}

    class Steps(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            clock.step_begin(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            clock.step_end(state.global_step - 1)
            clock.pending["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        trainer = build(setup, tmp)
        if started is not None:
            started(trainer, clock)
        trainer._prepare_inputs = clock.wrap_prepare_inputs(trainer._prepare_inputs)
        clock.info["torch_threads"] = torch.get_num_threads()
        trainer.add_callback(Steps())
        trainer.train()
    if clock.pending is not None:
        clock.send(clock.pending)


def main() -> None:
    out = _protocol_stream()
    setup = json.loads(sys.argv[1])
    os.environ.setdefault("OMP_NUM_THREADS", str(setup["threads"]))
    run_steps(out, setup, build_trainer, "mtrl-bench-trl-")


if __name__ == "__main__":
    main()
