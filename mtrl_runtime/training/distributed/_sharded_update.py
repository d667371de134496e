"""Data-parallel training across processes: torch FSDP2 (``fully_shard``), launched by ``torchrun``.

``torchrun --nproc-per-node N -m mtrl_runtime.cli train config.yaml --agent ...``
starts N processes. Rank 0, the leader, runs everything a one-process run
runs (engine, coordinator, store, rollouts, MLflow); every rank holds one
shard of the policy (FSDP2: each decoder layer and the root are
``fully_shard`` units, parameters are DTensors split over the ranks). Only
rank 0 reads the model's weights; every rank builds the policy on the meta
device, shards it and receives its shards from rank 0 (``_rank0_weights``). Each
collective operation starts on the leader, which broadcasts a command (the
step's samples, a folder to save to) that the other ranks, in ``follow()``,
wait for; then every rank runs the same collective work.

One step (``ShardedUpdate.step``, on every rank, on the same samples):

- samples that train a token are sorted longest first and dealt out in
  rounds of ``world_size``, one sample per rank per round, so each round's
  rows have similar lengths; the ranks' micro-batch counts are equal by
  construction (FSDP gathers each layer's parameters once per forward and
  reduce-scatters its gradients once per backward: every rank must make
  the same number of passes). A rank left without a sample in the last
  round runs a padding pass: the shortest sample with an infinite loss
  denominator, so its gradient is exactly zero;
- each rank's loss is divided by the whole step's denominator (tokens or
  sequences, ``update.loss_normalizer``) and FSDP sums the gradients
  (divide factor 1), so the gradient is that of the one-process step;
- the gradient norm (clipping) is global, a non-finite loss or gradient
  skips the step on every rank, AdamW updates each rank's shard.

The adapter (or model) and the optimizer state are gathered for saving:
LoRA gathers only the adapter weights. A resume (``load_checkpoint``) is the
other way round: rank 0 reads the one-process checkpoint
(``_sharded_checkpoint``) and DCP broadcasts it, each rank keeping its shard.
Joining the job, and each rank's device (``cuda:LOCAL_RANK`` or the CPU): ``_ranks``.
Launch, layout and memory: docs/scaling.md.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from ...engines import resolve_model
from ...types import Sample
from ..update import (TRAINER_STATE, WEIGHTS_FOLDER, NonFiniteWeights, Policy, PolicyUpdate, UpdateSettings,
                      atomic_folder, loss_normalizer, nonfinite_rollouts, policy_settings,
                      preflight_folder)
from ._fsdp import full_value, local_shard, shard_policy
from ._rank0_weights import InitialWeights, build_sharded_policy
from ._ranks import Ranks, leave_job
from ._sharded_checkpoint import indexed_optimizer_state, load_from_rank0, read_checkpoint


# metrics that add up over ranks and rounds; every other ``train/`` metric is a per-token mean
SUMMED = frozenset({
    "train/loss", "train/tokens_forward", "train/tokens_real", "train/tokens_shared", "train/micro_batches",
    "train/tokens_trained", "train/samples",
})


def follow_training(config: Any, ranks: Ranks) -> int:
    """A rank other than 0: build the run's policy, shard it with the others, run the leader's commands."""
    folder = resolve_model(config.core.model)
    preflight_folder(config, folder, world_size=ranks.world_size)
    sharded = sharded_update_from_config(config, folder, ranks)
    sharded.check_fits()
    ran = sharded.follow()
    leave_job()
    return ran


def sharded_update_from_config(config: Any, folder: str | Path, ranks: Ranks) -> "ShardedUpdate":
    """The run's sharded update on every rank: only rank 0 reads ``folder``'s weights (``_rank0_weights``)."""
    settings = policy_settings(config, folder)
    del settings["device"]  # every rank fills its shards on its own device (ranks.device)
    policy, initial = build_sharded_policy(folder, ranks.leader, **settings)
    return ShardedUpdate.build(policy, UpdateSettings.from_config(config), ranks, initial)


def deal_rounds(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Sample indices per round, one per rank: longest first, so a round's rows have similar lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[start:start + world_size] for start in range(0, len(order), world_size)]


class ShardedUpdate:
    """A ``PolicyUpdate`` over an FSDP2-sharded policy; on the leader, each call leads the other ranks.

    It answers what the loop, the checkpoints and ``PushedWeights`` ask of an
    update (``step``, ``version``, ``save_checkpoint``, ``weights_finite``,
    ``policy.save_weights``). The other ranks run ``follow()``.
    """

    def __init__(self, update: PolicyUpdate, ranks: Ranks) -> None:
        """``update``: a PolicyUpdate built on a policy ``shard_policy`` sharded (``ShardedUpdate.build`` does both)."""
        if update.settings.logprob_chunk_tokens:
            raise ValueError("ShardedUpdate: build the PolicyUpdate with logprob_chunk_tokens=0 "
                             "(chunked logprobs call the decoder and the LM head apart, outside FSDP's root unit); "
                             "ShardedUpdate.build does")
        self.update = update
        self.ranks = ranks
        self.policy = _LeaderPolicy(self)
        self._failed = False  # a led command raised: the ranks are out of step (see stop)
        self._commands: dict[str, Callable[[Any], Any]] = {
            "step": self._step,
            "save_weights": self._save_weights,
            "save_checkpoint": self._save_checkpoint,
            "weights_finite": lambda _: self._weights_finite(),
            "load_checkpoint": self._load_checkpoint,
        }

    @classmethod
    def build(cls, policy: Policy, settings: UpdateSettings, ranks: Ranks,
              initial: InitialWeights) -> "ShardedUpdate":
        """Shard ``policy``, built on the meta device, fill it with rank 0's ``initial`` weights (every rank:
        ``build_sharded_policy`` gives both) and wrap its update.

        Log-probabilities are computed unchunked (the model's own forward, logits at
        the trained positions only): the chunked path calls the decoder and the LM
        head as two modules, and FSDP gathers the root's weights (embeddings, head)
        only around the whole model's forward.
        """
        shard_policy(policy, initial, ranks.device)
        return cls(PolicyUpdate(policy, replace(settings, logprob_chunk_tokens=0)), ranks)

    @property
    def version(self) -> int:
        return self.update.version

    @property
    def skipped_nonfinite(self) -> int:
        return self.update.skipped_nonfinite

    def check_fits(self) -> None:
        """This rank's step fits its device (``PolicyUpdate.check_fits``; the estimate counts this rank's shards
        and the whole weights of the FSDP units gathered at once)."""
        self.update.check_fits()

    # -- the leader's calls: each broadcasts its command, then runs it here too ------------------

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        return self._lead("step", list(samples))

    def save_weights(self, folder: str | Path) -> Path:
        return self._lead("save_weights", str(folder))

    def save_checkpoint(self, folder: str | Path) -> Path:
        return self._lead("save_checkpoint", str(folder))

    def weights_finite(self) -> bool:
        return self._lead("weights_finite", None)

    def load_checkpoint(self, folder: str | Path) -> None:
        """Restore a checkpoint (one written here, or by one process): rank 0 reads it, every rank loads its shard."""
        self._lead("load_checkpoint", str(folder))

    def stop(self, leave: bool = False) -> None:
        """Release the other ranks from ``follow()`` (the leader calls it once, at the end); with ``leave``, then
        leave the job with them (``leave_job``: ``follow_training`` does the same on the other ranks).

        After a command failed here the other ranks may be inside one of its
        collectives: nothing is sent, the leader's process exits with the
        error and torchrun stops the others.
        """
        if not self._failed:
            _broadcast(("stop", None))
            if leave:
                leave_job()

    def _lead(self, name: str, argument: Any) -> Any:
        if not self.ranks.leader:
            raise RuntimeError(f"ShardedUpdate.{name}: only rank 0 leads; rank {self.ranks.rank} runs follow()")
        _broadcast((name, argument))
        try:
            return self._commands[name](argument)
        except BaseException:
            self._failed = True
            raise

    # -- the other ranks ----------------------------------------------------------------------------

    def follow(self) -> int:
        """Run the leader's commands until it says stop; returns how many ran."""
        ran = 0
        while True:
            name, argument = _broadcast(None)
            if name == "stop":
                return ran
            self._commands[name](argument)
            ran += 1

    # -- the collective work, on every rank ------------------------------------------------------

    def _step(self, samples: Sequence[Sample]) -> dict[str, float]:
        start = time.perf_counter()
        update = self.update
        poisoned = nonfinite_rollouts(samples)
        if poisoned:  # the same verdict on every rank: they all hold the same samples
            return update.skipped(samples, "advantages", poisoned, start, {"train/tokens_trained": 0.0},
                                  warn=self.ranks.leader)
        kept = [s for s in samples if any(s.loss_mask_T[1:])]
        normalizer = loss_normalizer(kept, update.settings.loss.aggregation)
        with update.weights_lock, self._training_mode():
            update.optimizer.zero_grad(set_to_none=True)
            local = self._backward(kept, normalizer)
            metrics = self._combine(local)
            skipped = update.apply_gradients(samples, start, metrics, full_value, warn=self.ranks.leader)
            if skipped is not None:
                return skipped
        metrics["train/policy_version"] = float(update.version)
        metrics["train/world_size"] = float(self.ranks.world_size)
        metrics["train/step_seconds"] = time.perf_counter() - start
        return metrics

    def _backward(self, kept: Sequence[Sample], normalizer: float) -> list[dict[str, float]]:
        """This rank's share of the step's gradients; its metrics per real round."""
        if not kept:
            return []
        lengths = [len(s.token_ids_T) for s in kept]
        shortest = kept[min(range(len(kept)), key=lambda i: lengths[i])]
        out = []
        for round_ in deal_rounds(lengths, self.ranks.world_size):
            if self.ranks.rank < len(round_):
                out.append(self.update.backward([kept[round_[self.ranks.rank]]], normalizer=normalizer))
            else:  # padding pass: the same collectives as the other ranks, a zero gradient
                self.update.backward([shortest], normalizer=math.inf)
        return out

    def _combine(self, rounds: Sequence[dict[str, float]]) -> dict[str, float]:
        """The step's metrics over every rank's rounds: sums, or per-token means weighted by trained tokens."""
        sums: dict[str, float] = {}
        for metrics in rounds:
            tokens = metrics["train/tokens_trained"]
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + (value if name in SUMMED else value * tokens)
        gathered: list[Any] = [None] * self.ranks.world_size
        dist.all_gather_object(gathered, sums)
        total: dict[str, float] = {name: 0.0 for name in SUMMED}
        for part in gathered:
            for name, value in part.items():
                total[name] = total.get(name, 0.0) + value
        trained = max(total["train/tokens_trained"], 1.0)
        return {name: value if name in SUMMED else value / trained for name, value in total.items()}

    @contextlib.contextmanager
    def _training_mode(self) -> Iterator[None]:
        self.update.policy.model.train()
        try:
            yield
        finally:
            self.update.policy.model.eval()

    def _weights_finite(self) -> bool:
        local = all(bool(torch.isfinite(local_shard(p)).all()) for p in self.update.policy.trainable_parameters())
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=self.ranks.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    # -- gathering for saves ----------------------------------------------------------------------

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every rank gathers; rank 0 gets the trained weights as full CPU tensors (LoRA: the adapter only).

        Names are the model's own state-dict names, as ``save_pretrained`` expects.
        """
        policy = self.update.policy
        names = {id(p): name for name, p in policy.model.named_parameters()}
        wanted = policy.trainable_parameters() if policy.lora else list(policy.model.parameters())
        state = {}
        for param in wanted:
            full = full_value(param.detach())
            if self.ranks.leader:
                state[names[id(param)]] = full.cpu()
        return state

    def _save_weights(self, folder: str) -> Path:
        state = self.full_state()
        if self.ranks.leader:
            policy = self.update.policy
            with atomic_folder(folder) as tmp:
                policy.model.save_pretrained(tmp, state_dict=state)
                if policy.tokenizer is not None and not policy.lora:
                    policy.tokenizer.save_pretrained(tmp)
        return Path(folder)

    def _save_checkpoint(self, folder: str) -> Path:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if not self._weights_finite():
            raise NonFiniteWeights(f"refusing to write checkpoint {folder}: the policy holds non-finite weights")
        update = self.update
        with update.weights_lock:
            optimizer = get_optimizer_state_dict(
                update.policy.model, update.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            self._save_weights(str(Path(folder) / WEIGHTS_FOLDER))
        if self.ranks.leader:  # the format of a one-process checkpoint: ``PolicyUpdate.load_checkpoint`` reads it
            state = {"optimizer": indexed_optimizer_state(optimizer), "version": update.version,
                     "world_size": self.ranks.world_size}
            torch.save(state, Path(folder) / TRAINER_STATE)
        return Path(folder)

    def _load_checkpoint(self, folder: str) -> None:
        """Rank 0 reads the weights and optimizer state (the one-process format) and broadcasts them; each rank
        keeps its shard (DCP's ``broadcast_from_rank0``). A checkpoint rank 0 cannot read fails on every rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        update = self.update
        weights: dict[str, torch.Tensor] = {}
        optimizer: dict[str, Any] = {}
        verdict: tuple[int, str | None] = (0, None)
        if self.ranks.leader:
            try:
                weights, optimizer, version = read_checkpoint(Path(folder), update)
                verdict = (version, None)
            except Exception as error:  # every rank must hear of it, or the others wait in the broadcasts below
                verdict = (0, f"{type(error).__name__}: {error}")
        version, error = _broadcast(verdict)
        if error is not None:
            raise RuntimeError(f"resume under torchrun: rank 0 could not read checkpoint {folder}: {error}")
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        with update.weights_lock:
            load_from_rank0(update.policy.model, weights, strict=False)  # LoRA: the adapter only
            set_optimizer_state_dict(update.policy.model, update.optimizer, optimizer, options=options)
        update.version = version


class _LeaderPolicy:
    """What ``PushedWeights`` and the trainer's finish call on ``update.policy``: saving, led from rank 0."""

    def __init__(self, sharded: ShardedUpdate) -> None:
        self._sharded = sharded

    @property
    def lora(self) -> bool:
        return self._sharded.update.policy.lora

    def save_weights(self, folder: str | Path) -> Path:
        return self._sharded.save_weights(folder)


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


__all__ = ["SUMMED", "ShardedUpdate", "deal_rounds", "follow_training", "sharded_update_from_config"]
