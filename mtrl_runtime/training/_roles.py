"""Roles in training: each role's batch from its own view of the step's groups, and one LoRA adapter per role.

``prepare_role_batch`` runs ``_batch.prepare_batch`` once per role over the
groups seen as that role played them (``roles.role_view``: its turns only,
its own reward where the agent reported one), so advantages are computed per
role within each group by the run's method, and a group whose role rewards
are all equal carries no signal for that role alone. Every sample is tagged
with its role.

``RoleUpdates`` holds one peft adapter per role on one base model (named by
the role) and one ``PolicyUpdate`` (its own AdamW state) per adapter. A step
trains each role's adapter on that role's samples only: peft's
``set_adapter`` makes the role's adapter the active and only trainable one
while its update runs, so another role's weights receive no gradient.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Mapping, Sequence

import torch

from ..algorithms import AdvantageParams
from ..roles import role_view
from ..rollouts import GroupResult
from ..types import Sample
from ._batch import PreparedBatch, prepare_batch
from .update import Policy, PolicyUpdate, UpdateSettings


def prepare_role_batch(
    groups: Sequence[GroupResult],
    roles: Sequence[str],
    method: str,
    params: AdvantageParams,
    versions: Mapping[str, int],
    max_off_policy: int,
) -> dict[str, PreparedBatch]:
    """Each role's samples, advantaged within each group by that role's rewards; staleness by its own version."""
    out = {}
    for role in roles:
        seen = [dataclasses.replace(g, kept=tuple(role_view(r, role) for r in g.kept)) for g in groups]
        batch = prepare_batch(seen, method, params, int(versions[role]), max_off_policy)
        samples = [dataclasses.replace(s, role=role) for s in batch.samples]
        out[role] = dataclasses.replace(batch, samples=samples)
    return out


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
        model.eval()

    @property
    def versions(self) -> dict[str, int]:
        """Each role's optimizer steps taken."""
        return {role: update.version for role, update in self.updates.items()}

    def step(self, samples: Sequence[Sample], trained: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
        """Train each role in ``trained`` (default: all) on its own samples; returns each role's step metrics.

        A sample of a role not trained now (an alternating schedule's frozen role) is left out; a sample with no
        role, or a role this run does not have, is refused naming it.
        """
        trained = self.roles if trained is None else tuple(trained)
        by_role: dict[str, list[Sample]] = {role: [] for role in self.roles}
        for sample in samples:
            if sample.role not in by_role:
                raise ValueError(f"sample of rollout {sample.rollout_id!r}: role {sample.role!r} is none of this "
                                 f"run's roles {list(self.roles)!r}")
            by_role[sample.role].append(sample)
        out = {}
        for role in trained:
            if not by_role[role]:
                continue
            with self.weights_lock:
                self.policy.model.set_adapter(role)
                out[role] = self.updates[role].step(by_role[role])
        return out

    def save_weights(self, folder: str | Path) -> dict[str, Path]:
        """Each role's adapter in ``folder/<role>`` (a peft adapter folder an engine loads by the role's name)."""
        saved = {}
        with self.weights_lock:
            for role in self.roles:
                target = Path(folder) / role
                target.mkdir(parents=True, exist_ok=True)
                self.policy.model.save_pretrained(str(target), selected_adapters=[role])
                saved[role] = target / role  # peft writes a named adapter into a subfolder of its name
        return saved


__all__ = ["RoleUpdates", "prepare_role_batch", "role_metrics"]
