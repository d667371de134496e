"""The settings of a policy update (``PolicyUpdate``): loss, optimizer, batching and memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...algorithms.losses import LOSSES, LossParams


@dataclass(frozen=True)
class UpdateSettings:
    """How a step trains: loss, optimizer and batching settings."""

    loss_fn: str = "ppo"
    loss: LossParams = field(default_factory=LossParams)
    learning_rate: float = 4e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 4096
    precision: str = "auto"  # auto | bf16 | fp32
    share_prefix: bool = True  # run a prompt prefix the rows of a micro-batch share once (see _packing)
    logprob_chunk_tokens: int = 512  # positions per LM-head chunk; 0: all kept positions' logits at once
    gradient_checkpointing: str = "auto"  # auto | on | off (see the module docstring)
    fit_memory: bool = True  # micro-batches of at most micro_batch_tokens, fewer when free memory is short

    def __post_init__(self) -> None:
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if self.logprob_chunk_tokens < 0:
            raise ValueError(f"logprob_chunk_tokens must be >= 0 (0: unchunked), got {self.logprob_chunk_tokens}")
        if self.gradient_checkpointing not in ("auto", "on", "off"):
            raise ValueError(f"gradient_checkpointing must be auto, on or off, got {self.gradient_checkpointing!r}")
        LOSSES.get(self.loss_fn)  # unknown names fail here, listing the known ones

    @classmethod
    def from_config(cls, config: Any) -> "UpdateSettings":
        """From an ``MtrlConfig``."""
        return cls(
            loss_fn=config.core.loss_fn,
            loss=LossParams.from_config(config.advanced),
            learning_rate=config.core.learning_rate,
            max_grad_norm=config.advanced.max_grad_norm,
            micro_batch_tokens=config.advanced.micro_batch_tokens,
            precision=config.advanced.precision,
            logprob_chunk_tokens=config.advanced.logprob_chunk_tokens,
            gradient_checkpointing=config.advanced.gradient_checkpointing,
            fit_memory=config.advanced.fit_micro_batches,
        )


__all__ = ["UpdateSettings"]
