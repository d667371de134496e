"""Supervised fine-tuning of the policy on demonstrations: the run's training stack with an NLL loss.

The policy is set up as ``mtrl train`` sets it up (``training.policy_from_config``:
LoRA with the run's rank, alpha and target modules, or every weight under
``advanced.full_finetune``) and trained by ``training.PolicyUpdate`` (its
micro-batches, precision, gradient clipping and memory fitting) with the
``nll`` loss (``algorithms.losses``): -log pi on the demonstrated tokens
(loss mask 1: the model's own turns and their end tokens), averaged over
tokens. The RL settings that do not apply to imitation (ratio bounds, the
KL term) are not used.

Demonstrations are split into a training set and a held-out set by group
(a task, or a conversation), so the held-out loss measures what was not
trained on. Each epoch shuffles the training samples (seeded), steps over
batches of ``batch_size`` samples, and reports the train loss (token mean
over the epoch, as measured by each step's forward pass) and the held-out
loss (after the epoch). The weights are written where ``mtrl train`` starts
from them (``advanced.init_adapter``): ``<out>/adapter``, with the report
``<out>/sft.json``.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..algorithms.losses import LossParams
from ..engines import resolve_model
from ..training import PolicyUpdate, UpdateSettings, policy_from_config
from ..types import Sample
from ._demonstration import Demonstration

ADAPTER_FOLDER = "adapter"
REPORT_FILE = "sft.json"


@dataclass(frozen=True)
class SftSettings:
    """How the fine-tuning runs: epochs, learning rate (None: ``core.learning_rate``), held-out share, batch."""

    epochs: int = 3
    learning_rate: float | None = None
    held_out: float = 0.1
    batch_size: int = 8  # samples per optimizer step
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {self.epochs}")
        if self.learning_rate is not None and not 0 < self.learning_rate <= 1:
            raise ValueError(f"--lr must be in (0, 1], got {self.learning_rate}")
        if not 0 <= self.held_out < 1:
            raise ValueError(f"--held-out must be in [0, 1), got {self.held_out}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    train_loss: float
    held_out_loss: float | None
    steps: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class SftResult:
    """What ``sft`` wrote and measured."""

    out: Path
    adapter: Path
    train: int  # demonstrations trained on
    held_out: int  # demonstrations held out
    held_out_before: float | None  # the held-out loss of the policy before fine-tuning
    epochs: tuple[EpochReport, ...]


def split_held_out(
    demos: Sequence[Demonstration], fraction: float, seed: int
) -> tuple[list[Demonstration], list[Demonstration]]:
    """(train, held out): whole groups held out, about ``fraction`` of them (at least one when fraction > 0
    and there are two groups or more), chosen by ``seed``."""
    groups = sorted({d.group for d in demos})
    held_count = 0
    if fraction > 0 and len(groups) > 1:
        held_count = min(len(groups) - 1, max(1, round(fraction * len(groups))))
    held = set(random.Random(seed).sample(groups, held_count))
    return [d for d in demos if d.group not in held], [d for d in demos if d.group in held]


def sft(
    config: Any,
    demos: Sequence[Demonstration],
    out: str | Path,
    settings: SftSettings = SftSettings(),
    echo: Callable[[str], None] = print,
) -> SftResult:
    """Fine-tune ``config``'s policy on ``demos``; write ``<out>/adapter`` and ``<out>/sft.json``."""
    if not demos:
        raise ValueError("sft: no demonstrations to train on (the source held none, or every one was left out)")
    empty = next((d for d in demos if d.tokens == 0), None)
    if empty is not None:
        raise ValueError(f"sft: demonstration {empty.name!r} has no token to learn (every assistant turn has weight 0)")
    out = Path(out)
    train, held = split_held_out(demos, settings.held_out, settings.seed)
    folder = resolve_model(config.core.model)
    policy = policy_from_config(config, folder)
    update = PolicyUpdate(policy, _update_settings(config, settings))
    update.check_fits()
    train_samples = [s for d in train for s in d.samples if any(s.loss_mask_T[1:])]
    held_samples = [s for d in held for s in d.samples if any(s.loss_mask_T[1:])]
    echo(f"mtrl sft: {len(train)} demonstrations to train on ({len(train_samples)} sequences, "
         f"{sum(sum(s.loss_mask_T) for s in train_samples)} tokens), {len(held)} held out; "
         f"{'full fine-tuning' if not policy.lora else f'LoRA rank {config.core.lora_rank}'} of {folder}")
    before = held_out_loss(update, held_samples)
    if before is not None:
        echo(f"mtrl sft: held-out loss before: {before:.4f}")
    rng = random.Random(settings.seed)
    epochs = []
    for epoch in range(1, settings.epochs + 1):
        started = time.perf_counter()
        order = list(train_samples)
        rng.shuffle(order)
        nll_sum = tokens = steps = 0.0
        for at in range(0, len(order), settings.batch_size):
            metrics = update.step(order[at : at + settings.batch_size])
            if metrics.get("train/skipped"):
                raise RuntimeError(f"sft: epoch {epoch}: a step was skipped for a non-finite loss or gradient; "
                                   "lower --lr")
            trained = metrics["train/tokens_trained"]
            nll_sum += metrics["train/nll"] * trained
            tokens += trained
            steps += 1
        report = EpochReport(epoch, nll_sum / max(tokens, 1.0), held_out_loss(update, held_samples), int(steps),
                             int(tokens), time.perf_counter() - started)
        epochs.append(report)
        held_text = f", held-out loss {report.held_out_loss:.4f}" if report.held_out_loss is not None else ""
        echo(f"mtrl sft: epoch {epoch}/{settings.epochs}: train loss {report.train_loss:.4f}{held_text} "
             f"({report.steps} steps, {report.seconds:.1f} s)")
    adapter = policy.save_weights(out / ADAPTER_FOLDER)
    result = SftResult(out, adapter, len(train), len(held), before, tuple(epochs))
    _write_report(result, config, settings, folder)
    return result


def held_out_loss(update: Any, samples: Sequence[Sample]) -> float | None:
    """The token-mean NLL of ``samples``' trained tokens under the policy now (None without samples)."""
    if not samples:
        return None
    total, count = 0.0, 0
    for logprobs in update.trained_logprobs(samples):
        total -= sum(logprobs)
        count += len(logprobs)
    value = total / max(count, 1)
    if not math.isfinite(value):
        raise RuntimeError("sft: the held-out loss is not finite; lower --lr")
    return value


def _update_settings(config: Any, settings: SftSettings) -> UpdateSettings:
    """The run's update settings (batching, precision, memory) with the NLL loss and the SFT learning rate."""
    return replace(
        UpdateSettings.from_config(config),
        loss_fn="nll",
        loss=LossParams(aggregation="token_mean"),  # imitation: no ratio bounds, no KL to the base
        learning_rate=settings.learning_rate if settings.learning_rate is not None else config.core.learning_rate,
    )


def _write_report(result: SftResult, config: Any, settings: SftSettings, folder: Path) -> None:
    data = {
        "model": config.core.model,
        "model_folder": str(folder),
        "full_finetune": config.advanced.full_finetune,
        "lora_rank": config.core.lora_rank,
        "lora_alpha": config.core.lora_alpha,
        "settings": asdict(settings),
        "demonstrations": {"train": result.train, "held_out": result.held_out},
        "held_out_loss_before": result.held_out_before,
        "epochs": [asdict(e) for e in result.epochs],
        "adapter": str(result.adapter),
    }
    (result.out / REPORT_FILE).write_text(json.dumps(data, indent=2) + "\n")


__all__ = ["ADAPTER_FOLDER", "REPORT_FILE", "EpochReport", "SftResult", "SftSettings", "held_out_loss", "sft",
           "split_held_out"]
