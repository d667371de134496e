"""Roles in training: each role's batch from its own view of the step's groups, and one LoRA adapter per role.

``prepare_role_batch`` runs ``_batch.prepare_batch`` once per role over the
groups seen as that role played them (``roles.role_view``: its turns only,
its own reward where the agent reported one), so advantages are computed per
role within each group by the run's method, and a group whose role rewards
are all equal carries no signal for that role alone. Every sample is tagged
with its role.

``prepare_step_batch`` is a step's batch as the loop trains it, with or
without roles (the roles the schedule trains at that step); ``mtrl
rescore`` rebuilds a run's batches with it.

``RoleUpdates`` holds one peft adapter per role on one base model (named by
the role) and one ``PolicyUpdate`` (its own AdamW state) per adapter. A step
trains each role's adapter on that role's samples only: peft's
``set_adapter`` makes the role's adapter the active and only trainable one
while its update runs, so another role's weights receive no gradient.
``RoleUpdates`` stands where a ``PolicyUpdate`` stands (the weights
strategies, the loop, checkpoints): ``step`` takes the step's samples of
every role and returns each role's metrics under ``role/<role>/``.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..algorithms import AdvantageParams
from ..roles import role_view, trained_roles
from ..rollouts import GroupResult
from ..types import Sample
from ._batch import PreparedBatch, batch_options, prepare_batch
from .update import TRAINER_STATE, WEIGHTS_FOLDER, NonFiniteWeights, Policy, PolicyUpdate, UpdateSettings, atomic_folder


def prepare_role_batch(
    groups: Sequence[GroupResult],
    roles: Sequence[str],
    method: str,
    params: AdvantageParams,
    version: int,
    max_off_policy: int,
    **options: bool,
) -> dict[str, PreparedBatch]:
    """Each role's samples, advantaged within each group by that role's rewards, with what it played: its mean
    reward (``rollout/reward/mean``), turns and generated tokens per rollout, over the groups' kept rollouts.
    ``options``: ``prepare_batch``'s (``batch_options``)."""
    out = {}
    for role in roles:
        seen = [dataclasses.replace(g, kept=tuple(role_view(r, role) for r in g.kept)) for g in groups]
        batch = prepare_batch(seen, method, params, version, max_off_policy, **options)
        samples = [dataclasses.replace(s, role=role) for s in batch.samples]
        played = [r for g in seen for r in g.kept]
        metrics = dict(batch.metrics)
        if played:
            metrics["rollout/reward/mean"] = sum(r.total_reward for r in played) / len(played)
            metrics["rollout/turns/mean"] = sum(len(r.turns) for r in played) / len(played)
            metrics["rollout/tokens/response_mean"] = sum(
                len(t.completion_ids) for r in played for t in r.turns) / len(played)
        out[role] = dataclasses.replace(batch, samples=samples, metrics=metrics)
    return out


def prepare_step_batch(
    config: Any,
    groups: Sequence[GroupResult],
    step: int,
    method: str,
    params: AdvantageParams,
    version: int,
    max_off_policy: int,
) -> PreparedBatch:
    """Step ``step``'s samples as the run of ``config`` trains them: of the one policy, or of each role its
    schedule trains at that step (``advanced.roles``), merged (``merge_role_batches``)."""
    options = batch_options(config)
    roles = config.advanced.role_map
    if roles is None:
        return prepare_batch(groups, method, params, version, max_off_policy, **options)
    trained = trained_roles(roles.roles, config.advanced.roles, step)
    per_role = prepare_role_batch(groups, trained, method, params, version, max_off_policy, **options)
    return merge_role_batches(per_role, frozen=[r for r in roles.roles if r not in trained])


_SUMMED = ("samples/", "async/stale_samples_dropped", "analysis/zero_adv_groups", "analysis/equal_reward_groups")


def merge_role_batches(batches: Mapping[str, PreparedBatch], frozen: Sequence[str] = ()) -> PreparedBatch:
    """One update's batch from each trained role's: their samples together; metrics under ``role/<role>/`` and,
    unprefixed, counts summed over the roles and the rest averaged (what a one-policy run's charts read);
    ``role/<role>/frozen`` 1.0 for each role an alternating schedule holds still this step."""
    samples = [s for b in batches.values() for s in b.samples]
    rollout_ids = list(dict.fromkeys(rid for b in batches.values() for rid in b.rollout_ids))
    metrics = role_metrics({role: b.metrics for role, b in batches.items()})
    names = set.intersection(*(set(b.metrics) for b in batches.values())) if batches else set()
    for name in sorted(names):
        values = [b.metrics[name] for b in batches.values()]
        if name == "async/staleness_max":
            metrics[name] = max(values)
        else:
            metrics[name] = sum(values) if name.startswith(_SUMMED) else sum(values) / len(values)
    metrics.update({f"role/{role}/frozen": 1.0 for role in frozen})
    metrics.update({f"role/{role}/frozen": 0.0 for role in batches})
    staleness = tuple(d for b in batches.values() for d in b.staleness_S)
    return PreparedBatch(samples, rollout_ids, metrics, staleness)


def role_metrics(per_role: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``{role: metrics}`` as one flat dict, each name under ``role/<role>/`` (how MLflow shows them apart)."""
    return {f"role/{role}/{name}": value for role, metrics in per_role.items() for name, value in metrics.items()}


class RoleUpdates:
    """One LoRA adapter (named by its role) and one ``PolicyUpdate`` per role, on ``policy``'s base model.

    ``policy`` is a LoRA policy (``update.build_policy``); its ``default`` adapter's config is the roles'. Each
    adapter starts at its LoRA initialisation (B = 0: the base model's outputs), A drawn from a generator seeded
    by ``seed`` and the role's position, so a run restarts from the same adapters.
    """

    def __init__(self, policy: Policy, roles: Sequence[str], settings: UpdateSettings | None = None,
                 weights_lock: object = None, seed: int = 0) -> None:
        if not policy.lora:
            raise ValueError(f"roles {list(roles)!r}: each role trains its own LoRA adapter; this policy is "
                             "fully trainable (full_finetune), which has none")
        model = policy.model
        config = model.peft_config["default"]
        for i, role in enumerate(roles):
            with torch.random.fork_rng(devices=[]):  # the process's random state is left as it was
                torch.manual_seed(seed * 1000 + i)
                model.add_adapter(role, dataclasses.replace(config))
        model.set_adapter(roles[0])
        model.delete_adapter("default")
        for param in model.parameters():  # LoRA weights and their AdamW state in fp32 over any base
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
        # re-entered: a role's step holds it around set_adapter and its PolicyUpdate takes it again
        weights_lock = weights_lock if weights_lock is not None else threading.RLock()
        self.policy = policy
        self.roles = tuple(roles)
        self.updates: dict[str, PolicyUpdate] = {}
        for role in self.roles:
            model.set_adapter(role)  # the optimizer takes the parameters trainable now: this role's alone
            self.updates[role] = PolicyUpdate(policy, settings, weights_lock)
        self.weights_lock = weights_lock
        self.version = 0  # steps that trained some role (what the engine's policy version and staleness count)
        model.eval()

    @property
    def versions(self) -> dict[str, int]:
        """Each role's optimizer steps taken."""
        return {role: update.version for role, update in self.updates.items()}

    def check_fits(self) -> None:
        """Each role's step fits in memory (``PolicyUpdate.check_fits``)."""
        for role, update in self.updates.items():
            with self.weights_lock:
                self.policy.model.set_adapter(role)
                update.check_fits()

    def weights_finite(self) -> bool:
        return all(update.weights_finite() for update in self.updates.values())

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Train each role that has samples here on its own samples (an alternating schedule's frozen role gets
        none: ``roles.trained_roles``); returns each role's step metrics under ``role/<role>/``, and ``version``
        counts the calls that trained some role.

        A sample with no role, or a role this run does not have, is refused naming it.
        """
        by_role: dict[str, list[Sample]] = {role: [] for role in self.roles}
        for sample in samples:
            if sample.role not in by_role:
                raise ValueError(f"sample of rollout {sample.rollout_id!r}: role {sample.role!r} is none of this "
                                 f"run's roles {list(self.roles)!r}")
            by_role[sample.role].append(sample)
        per_role = {}
        for role, mine in by_role.items():
            if not mine:
                continue
            with self.weights_lock:
                self.policy.model.set_adapter(role)
                per_role[role] = self.updates[role].step(mine)
        if any(m.get("train/tokens_trained", 0.0) > 0 and not m.get("train/skipped") for m in per_role.values()):
            self.version += 1
        metrics = role_metrics(per_role)
        metrics["train/tokens_trained"] = sum(m.get("train/tokens_trained", 0.0) for m in per_role.values())
        metrics["train/policy_version"] = float(self.version)
        return metrics

    def save_weights(self, folder: str | Path) -> dict[str, Path]:
        """Each role's adapter in ``folder/<role>/`` (a peft adapter folder an engine loads by the role's name),
        written atomically."""
        with self.weights_lock, atomic_folder(folder) as tmp:
            self.policy.model.save_pretrained(str(tmp), selected_adapters=list(self.roles))  # peft: tmp/<role>/
        return {role: Path(folder) / role for role in self.roles}

    # -- checkpoints: every role's adapter and optimizer state in one folder ------------------------------------
    def save_checkpoint(self, folder: str | Path) -> Path:
        """Every role's adapter (``weights/<role>/``) and AdamW state, atomically; never non-finite weights."""
        if not self.weights_finite():
            raise NonFiniteWeights(f"refusing to write checkpoint {folder}: a role's adapter holds non-finite weights")
        with self.weights_lock, atomic_folder(folder) as tmp:
            for role in self.roles:
                self.policy.model.save_pretrained(str(tmp / WEIGHTS_FOLDER / role), selected_adapters=[role])
            state = {"optimizers": {r: u.optimizer.state_dict() for r, u in self.updates.items()},
                     "versions": self.versions, "version": self.version}
            torch.save(state, tmp / TRAINER_STATE)
        return Path(folder)

    def load_checkpoint(self, folder: str | Path) -> None:
        """Restore what ``save_checkpoint`` wrote (each role's adapter by its name)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        with self.weights_lock:
            state = torch.load(folder / TRAINER_STATE, map_location=self.policy.device, weights_only=True)
            missing = sorted(set(self.roles) - set(state.get("optimizers", {})))
            if missing:
                raise ValueError(f"checkpoint {str(folder)!r} holds no state for the roles {missing!r}; it was "
                                 "written by a run with other roles (advanced.policy_models)")
            for role in self.roles:
                [weights] = sorted((folder / WEIGHTS_FOLDER / role).rglob("adapter_model.safetensors"))
                set_peft_model_state_dict(self.policy.model, load_file(str(weights), device=str(self.policy.device)),
                                          adapter_name=role)
                self.updates[role].optimizer.load_state_dict(state["optimizers"][role])
                self.updates[role].version = int(state["versions"][role])
            self.version = int(state["version"])


__all__ = ["RoleUpdates", "merge_role_batches", "prepare_role_batch", "prepare_step_batch", "role_metrics"]
