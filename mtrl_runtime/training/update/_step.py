"""One policy update: samples → micro-batches → loss → accumulated gradients → AdamW step.

Samples are packed into right-padded micro-batches whose forward cost
fits ``micro_batch_tokens`` (rows x longest row, a prompt prefix the rows
share counted once: see ``_packing``; a prefix every sample shares runs
once for the whole step, ``StepPrefix``). Each micro-batch gets one forward
pass (two with a shared prefix); the logits at position i give the log-probability of token
i + 1. Every micro-batch's loss is divided by the whole step's token count
(or sequence count), so the accumulated gradient equals that of one big
batch. Only positions that predict a generated token are projected to the
vocabulary, ``logprob_chunk_tokens`` at a time (``_chunked``: the decoder
runs once, then each chunk's LM head + log-softmax + pick is recomputed in
the backward pass, so no step holds [tokens x vocab] logits). Memory
(``_fit``): micro-batches shrink to what free memory holds
(``fit_memory``), and decoder layers recompute their activations in the
backward pass when ``gradient_checkpointing`` is on, or on "auto" where
memory, not compute, limits the micro-batch: when free memory (CUDA: the
device's; CPU: available RAM) does not hold a micro-batch of
``micro_batch_tokens`` without it. Checkpointing costs a second forward
pass of the decoder and the shared-prefix saving, so where memory is
plentiful it is off.

The update holds ``weights_lock`` from the first forward to the optimizer
step, so an in-process engine sharing the model never generates from
half-updated weights; the model is in train() only inside that window.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ...algorithms.losses import LOSSES
from ...diagnostics import NONFINITE_SKIPPED
from ...types import Sample
from . import _memory
from ._gradient_checkpointing import checkpoint_layers, checkpointed
from ._chunked import chunked_logprobs, decoder_and_head, splits_head
from ._fit import MIN_MICRO_BATCH_TOKENS, StepMemory, check_fits, estimate_for_model, fit_tokens
from ._packing import (StepPrefix, batch_cost, can_share_prefix, common_prefix_length, pack_micro_batches,
                       shared_prefix_hidden, shared_prefix_logits, usable_shared)
from ._policy import Policy, atomic_folder
from ._nonfinite import NonFiniteWeights, nonfinite_cause, nonfinite_rollouts
from ._precision import lora_inputs_uncast, resolve_autocast
from ._settings import UpdateSettings
from ._teacher import Teacher

log = logging.getLogger("mtrl.train")

TRAINER_STATE = "trainer_state.pt"
WEIGHTS_FOLDER = "weights"


class PolicyUpdate:
    """Owns the optimizer of a Policy and runs training steps on Samples."""

    def __init__(
        self,
        policy: Policy,
        settings: UpdateSettings | None = None,
        weights_lock: Any = None,
        teacher: Teacher | None = None,
    ) -> None:
        """``weights_lock``: a threading.Lock or RLock shared with an engine that runs the same
        model object (a private lock when None). ``teacher``: the frozen model whose logprobs of the
        sampled tokens the distill loss reads (``_teacher``); required by it, refused by the others."""
        self.policy = policy
        self.settings = settings or UpdateSettings()
        if self.settings.loss.needs_teacher != (teacher is not None):
            raise ValueError(f"loss {self.settings.loss_fn!r} with distill_coef {self.settings.loss.distill_coef} "
                             f"{'needs a teacher (advanced.distill_teacher)' if teacher is None else 'takes no teacher'}")
        self.teacher = teacher
        self.loss_fn = LOSSES.get(self.settings.loss_fn)
        self.weights_lock = weights_lock if weights_lock is not None else threading.Lock()
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=self.settings.learning_rate,
            weight_decay=self.settings.weight_decay,
        )
        self.autocast_dtype = resolve_autocast(self.settings.precision, policy.device)
        self._share_prefix = self.settings.share_prefix and can_share_prefix(policy.model)
        self._chunk_tokens = self.settings.logprob_chunk_tokens
        if self._chunk_tokens:
            with self.weights_lock:  # a model whose logits are not head(decoder) (soft-capping, scaling): unchunked
                self._chunk_tokens = self._chunk_tokens if splits_head(policy.model) else 0
        self._estimates: dict[bool, StepMemory] = {}
        self.free_memory = _memory.available_bytes  # device -> bytes a step may allocate (a seam for tests)
        self.version = 0  # optimizer steps taken
        self.skipped_nonfinite = 0  # steps skipped for a non-finite advantage, loss or gradient

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Train on ``samples`` once: gradients of the whole batch, clip, AdamW step."""
        start = time.perf_counter()
        poisoned = nonfinite_rollouts(samples)
        if poisoned:  # a non-finite advantage would reach every weight through the loss: no forward at all
            return self.skipped(samples, "advantages", poisoned, start, {"train/tokens_trained": 0.0})
        with self.weights_lock, self._training_mode():
            self.optimizer.zero_grad(set_to_none=True)
            metrics = self.backward(samples)
            skipped = self.apply_gradients(samples, start, metrics)
            if skipped is not None:
                return skipped
        _memory.release_free_memory()  # a step's peak would otherwise stay in this thread's malloc arena
        metrics["train/policy_version"] = float(self.version)
        metrics["train/step_seconds"] = time.perf_counter() - start
        return metrics

    def apply_gradients(
        self, samples: Sequence[Sample], start: float, metrics: dict[str, float],
        norm_value: Callable[[torch.Tensor], Any] = float, warn: bool = True,
    ) -> dict[str, float] | None:
        """After the backward passes, under the weights lock: clip the gradients and step the optimizer, unless
        the loss or the gradient norm is not finite; the gradients are dropped either way.

        Returns the skipped step's metrics, or None once stepped (``metrics`` then has the grad norm).
        ``norm_value``: the clipped norm as a number (a sharded update gathers it); ``warn``: log a skip here.
        """
        if metrics["train/tokens_trained"] > 0:
            params = self.policy.trainable_parameters()
            grad_norm = float(norm_value(torch.nn.utils.clip_grad_norm_(params, self.settings.max_grad_norm)))
            bad = nonfinite_cause(metrics["train/loss"], grad_norm)
            if bad is not None:  # the step is skipped: the weights and the optimizer state stay as they were
                self.optimizer.zero_grad(set_to_none=True)
                return self.skipped(samples, bad, sorted({s.rollout_id for s in samples}), start, metrics, warn)
            metrics["train/grad_norm"] = grad_norm
            self.optimizer.step()
            self.version += 1
        self.optimizer.zero_grad(set_to_none=True)
        return None

    def skipped(
        self, samples: Sequence[Sample], cause: str, rollout_ids: Sequence[str], start: float,
        metrics: dict[str, float], warn: bool = True,
    ) -> dict[str, float]:
        """Metrics of a step skipped for non-finite ``cause`` (only finite values kept: the commit refuses others)."""
        self.skipped_nonfinite += 1
        if warn:  # a sharded update warns on its leader only
            shown = ", ".join(rollout_ids[:10]) + (f" and {len(rollout_ids) - 10} more" if len(rollout_ids) > 10 else "")
            log.warning("mtrl: update skipped: non-finite %s (policy version stays %d); rollouts: %s",
                        cause, self.version, shown)
        out = {k: v for k, v in metrics.items() if math.isfinite(v)}
        out.update({
            NONFINITE_SKIPPED: 1.0,
            "train/skipped": 1.0,
            "train/samples": float(len(samples)),
            "train/policy_version": float(self.version),
            "train/step_seconds": time.perf_counter() - start,
        })
        return out

    def weights_finite(self) -> bool:
        """Whether every trainable weight is a finite number."""
        return all(bool(torch.isfinite(p).all()) for p in self.policy.trainable_parameters())

    def trained_logprobs(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """The trainer's log-probability of each sample's trained tokens (positions t >= 1 with
        ``loss_mask_T[t] == 1``, in order), computed as a step computes them (same precision, chunking,
        eval mode) but without gradients, one sample at a time: what the loss compares with
        ``behaviour_logprobs_T`` (the engine/trainer logprob gap, ``bench/gpu.py``)."""
        device = self.policy.device
        out: list[tuple[float, ...]] = []
        with self.weights_lock, torch.no_grad(), lora_inputs_uncast(self.policy.model, self.autocast_dtype):
            for sample in samples:
                ids_BT = torch.tensor([sample.token_ids_T], dtype=torch.long, device=device)
                keep_K = torch.nonzero(torch.tensor(sample.loss_mask_T[1:], device=device)).squeeze(-1)
                logprobs_BK = self._logprobs(self.policy.model, ids_BT, torch.ones_like(ids_BT), keep_K,
                                             ids_BT[:, 1:][:, keep_K])
                out.append(tuple(logprobs_BK[0].float().cpu().tolist()))
        return out

    def backward(self, samples: Sequence[Sample], normalizer: float | None = None) -> dict[str, float]:
        """Accumulate the step's gradients into ``.grad`` (no optimizer step); return metrics.

        The result does not depend on how samples are split into micro-batches.
        ``normalizer``: the loss denominator when ``samples`` are part of a larger
        step (a rank's share under ``training.distributed``); by default this batch's own.
        """
        kept = [s for s in samples if any(s.loss_mask_T[1:])]
        if normalizer is None:
            normalizer = loss_normalizer(kept, self.settings.loss.aggregation)
        totals: dict[str, float] = {}
        counts = {"loss": 0.0, "tokens_forward": 0.0, "tokens_real": 0.0, "tokens_shared": 0.0, "micro_batches": 0.0,
                  "tokens_step_prefix": 0.0}
        budget, recompute = self.step_plan()
        # a checkpointed layer cannot write the KV cache a shared prefix hands to the rows (see _gradient_checkpointing)
        shareable = [_untrained_head(s) for s in kept] if self._share_prefix and not recompute else None
        lengths = [len(s.token_ids_T) for s in kept]
        plan, base = pack_micro_batches(lengths, budget, shareable), 0
        if shareable and len(plan) > 1:  # a prefix every sample shares: once for the step, not once per batch
            base = usable_shared(len(kept), common_prefix_length(shareable))
            plan = pack_micro_batches(lengths, budget, shareable, base) if base else plan
        counts.update({"micro_batch_budget": float(budget), "gradient_checkpointing": float(recompute)})
        with lora_inputs_uncast(self.policy.model, self.autocast_dtype):
            step = self._step_prefix(kept[0].token_ids_T[:base]) if base else None
            if step is not None:
                counts["tokens_forward"] += base
                counts["tokens_shared"] += base * (len(plan) - 1)  # computed once, not once per micro-batch
                counts["tokens_step_prefix"] = float(base)
            for indices, shared in plan:
                batch = [kept[i] for i in indices]
                with checkpointed(self.policy.model, recompute):
                    loss, metrics = self._micro_batch(batch, normalizer, shared, step)
                    loss.backward()
                tokens = metrics.pop("tokens")
                for name, value in metrics.items():
                    totals[name] = totals.get(name, 0.0) + value * tokens
                counts["loss"] += float(loss.detach())
                counts["tokens_forward"] += batch_cost([len(s.token_ids_T) for s in batch], shared, base)
                counts["tokens_shared"] += (len(batch) - 1) * shared
                counts["tokens_real"] += sum(len(s.token_ids_T) for s in batch)
                counts["micro_batches"] += 1
            if step is not None:
                step.backward()
        trained = sum(sum(s.loss_mask_T[1:]) for s in kept)
        out = {f"train/{name}": value / max(trained, 1) for name, value in totals.items()}
        out.update({f"train/{name}": value for name, value in counts.items()})
        out["train/tokens_trained"] = float(trained)
        out["train/samples"] = float(len(kept))
        return out

    def step_plan(self) -> tuple[int, bool]:
        """(tokens per micro-batch, whether decoder layers recompute activations) for the next step."""
        settings = self.settings
        wanted = settings.gradient_checkpointing
        layers = bool(checkpoint_layers(self.policy.model))
        if wanted != "auto" and not settings.fit_memory:
            return settings.micro_batch_tokens, wanted == "on" and layers
        device = self.policy.device
        free = self.free_memory(device)
        ready = bool(self.optimizer.state)
        if wanted == "auto":
            short = self.memory_estimate(False).tokens_that_fit(free, optimizer_ready=ready) < settings.micro_batch_tokens
            recompute = layers and short
        else:
            recompute = wanted == "on" and layers
        budget = settings.micro_batch_tokens
        if settings.fit_memory:
            budget = fit_tokens(budget, self.memory_estimate(recompute), free, optimizer_ready=ready)
            if budget < settings.micro_batch_tokens:
                log.info("mtrl: micro-batches of %d tokens (micro_batch_tokens %d): %.2f GB free on %s",
                         budget, settings.micro_batch_tokens, free / 1024**3, device)
        return budget, recompute

    def check_fits(self) -> None:
        """Raise ``StepDoesNotFit``, with the numbers, when no micro-batch's step fits in free memory (before
        the first rollout: ``_trainer``). Checkpointing counts as on unless it is "off"."""
        settings, device = self.settings, self.policy.device
        recompute = settings.gradient_checkpointing != "off" and bool(checkpoint_layers(self.policy.model))
        tokens = min(settings.micro_batch_tokens, MIN_MICRO_BATCH_TOKENS) if settings.fit_memory \
            else settings.micro_batch_tokens
        check_fits(self.memory_estimate(recompute), tokens, self.free_memory(device), device, loaded=True)

    def memory_estimate(self, recompute: bool) -> StepMemory:
        """The estimated memory of a step (``_fit``), with or without checkpointing."""
        if recompute not in self._estimates:
            self._estimates[recompute] = estimate_for_model(
                self.policy.model, lora=self.policy.lora, compute_dtype=self.autocast_dtype,
                checkpointing=recompute, chunk_tokens=self._chunk_tokens)
        return self._estimates[recompute]

    def _step_prefix(self, ids: Sequence[int]) -> StepPrefix:
        """Run ``ids``, the prefix every sample of the step shares, once through what ``_logprobs`` runs."""
        ids_1P = torch.tensor([list(ids)], dtype=torch.long, device=self.policy.device)
        parts = decoder_and_head(self.policy.model) if self._chunk_tokens else None
        with self._autocast():
            if parts is not None:
                return StepPrefix(parts[0], ids_1P)
            return StepPrefix(self.policy.model, ids_1P,
                              **({"logits_to_keep": 1} if self.policy.supports_logits_to_keep else {}))

    def _micro_batch(
        self, batch: Sequence[Sample], normalizer: float, shared: int = 0, step: StepPrefix | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.policy.device
        width = max(len(s.token_ids_T) for s in batch)
        pad = self.policy.pad_token_id

        def rows(values: Any, fill: Any, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([list(v) + [fill] * (width - len(v)) for v in values], dtype=dtype, device=device)

        ids_BT = rows((s.token_ids_T for s in batch), pad, torch.long)
        attention_BT = rows(((1,) * len(s.token_ids_T) for s in batch), 0, torch.long)
        # targets are tokens 1..T-1, predicted by logits at positions 0..T-2
        mask_BT = rows((s.loss_mask_T for s in batch), 0, torch.float32)[:, 1:]
        old_BT = rows((s.behaviour_logprobs_T for s in batch), 0.0, torch.float32)[:, 1:]
        adv_BT = rows((s.advantages_T for s in batch), 0.0, torch.float32)[:, 1:]
        version_BT = rows((s.policy_version_T for s in batch), -1, torch.long)[:, 1:]
        # versions behind the one training (0 where masked): the loss's stale-token correction reads it
        lag_BT = (self.version - version_BT).clamp(min=0) * (version_BT >= 0)
        keep_K = torch.nonzero(mask_BT.any(0)).squeeze(-1)  # positions (in target space) any row trains
        targets_BK = ids_BT[:, 1:][:, keep_K]
        logprobs_BK = self._logprobs(self.policy.model, ids_BT, attention_BT, keep_K, targets_BK, shared, step)
        ref_BK = None
        if self.settings.loss.needs_reference:
            with torch.no_grad(), self.policy.reference() as reference:
                ref_BK = self._logprobs(reference, ids_BT, attention_BT, keep_K, targets_BK, shared)
        extra: dict[str, torch.Tensor] = {}
        if self.teacher is not None:  # scored beside the reference: same ids, same kept positions, no gradient
            with torch.no_grad():
                extra["teacher_logprobs_BT"] = self._logprobs(self.teacher.model, ids_BT, attention_BT, keep_K,
                                                              targets_BK, shared)
        return self.loss_fn(
            logprobs_BK,
            old_BT[:, keep_K],
            adv_BT[:, keep_K],
            mask_BT[:, keep_K],
            self.settings.loss,
            ref_logprobs_BT=ref_BK,
            normalizer=normalizer,
            **extra,
            lag_BT=lag_BT[:, keep_K],
        )

    def _logprobs(
        self, model: Any, ids_BT: torch.Tensor, attention_BT: torch.Tensor, keep_K: torch.Tensor,
        targets_BK: torch.Tensor, shared: int = 0, step: StepPrefix | None = None,
    ) -> torch.Tensor:
        """log pi(target) at the kept positions, in fp32: [B, K]. ``shared``: leading tokens all rows share
        (``step``: the first of them, already run once for the step)."""
        parts = decoder_and_head(model) if self._chunk_tokens else None
        if parts is not None:
            decoder, head = parts
            with self._autocast():
                if shared:
                    hidden_BKD = shared_prefix_hidden(decoder, ids_BT, attention_BT, shared, keep_K, step)
                else:
                    hidden_BKD = decoder(input_ids=ids_BT, attention_mask=attention_BT,
                                         use_cache=False).last_hidden_state[:, keep_K]
                return chunked_logprobs(head, hidden_BKD, targets_BK, self._chunk_tokens)
        with self._autocast():
            if shared:
                logits = shared_prefix_logits(model, ids_BT, attention_BT, shared, keep_K,
                                              self.policy.supports_logits_to_keep, step)
            elif self.policy.supports_logits_to_keep:
                logits = model(input_ids=ids_BT, attention_mask=attention_BT, logits_to_keep=keep_K).logits
            else:
                logits = model(input_ids=ids_BT, attention_mask=attention_BT).logits[:, keep_K]
        # log_softmax + pick as one fused op: forward and backward make fewer passes over the
        # [B, K, vocab] logits than gather - logsumexp (248 vs 372 ms for 8 x 64 x 49152 on one CPU thread)
        batch, kept, vocab = logits.shape
        nll = torch.nn.functional.cross_entropy(
            logits.float().reshape(batch * kept, vocab), targets_BK.reshape(-1), reduction="none"
        )
        return -nll.view(batch, kept)

    @contextlib.contextmanager
    def _training_mode(self) -> Iterator[None]:
        self.policy.model.train()
        try:
            yield
        finally:
            self.policy.model.eval()

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.policy.device.type, dtype=self.autocast_dtype)

    # -- checkpoints -------------------------------------------------------------

    def save_checkpoint(self, folder: str | Path) -> Path:
        """Write weights (adapter or model) and optimizer state into ``folder``, atomically; never non-finite ones."""
        with self.weights_lock:
            if not self.weights_finite():
                raise NonFiniteWeights(f"refusing to write checkpoint {folder}: the policy holds non-finite weights")
        with self.weights_lock, atomic_folder(folder) as tmp:
            self.policy.model.save_pretrained(tmp / WEIGHTS_FOLDER)
            state = {"optimizer": self.optimizer.state_dict(), "version": self.version}
            torch.save(state, tmp / TRAINER_STATE)
        return Path(folder)

    def load_checkpoint(self, folder: str | Path) -> None:
        """Restore what ``save_checkpoint`` wrote."""
        folder = Path(folder)
        with self.weights_lock:
            self.policy.load_weights(folder / WEIGHTS_FOLDER)
            state = torch.load(folder / TRAINER_STATE, map_location=self.policy.device, weights_only=True)
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])


def loss_normalizer(samples: Sequence[Sample], aggregation: str) -> float:
    """The step's loss denominator: trained tokens (``token_mean``) or trained samples (``sequence_mean``)."""
    kept = [s for s in samples if any(s.loss_mask_T[1:])]
    if aggregation == "token_mean":
        return float(sum(sum(s.loss_mask_T[1:]) for s in kept))
    return float(len(kept))


def _untrained_head(sample: Sample) -> tuple[int, ...]:
    """The tokens before the first logit the loss reads (a prefix shared up to there is computed once)."""
    first = next(i for i, trained in enumerate(sample.loss_mask_T) if trained and i > 0)
    return tuple(sample.token_ids_T[: first - 1])


__all__ = ["TRAINER_STATE", "WEIGHTS_FOLDER", "PolicyUpdate", "loss_normalizer"]
