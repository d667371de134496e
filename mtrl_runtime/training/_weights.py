"""How a new policy version reaches the engine that serves the agents.

Two strategies with one method, ``apply(samples) -> metrics`` (run the
update, then make its version the one served):

- ``SharedWeights``: the in-process ``hf`` engine runs the trainer's own
  model object (peft injects the LoRA layers in place). The update and the
  version bump happen under the engine's ``weights_lock``, so no forward pass
  sees half-updated weights and a turn is never labelled with a version its
  weights are not; the new version is served from the next forward pass.
  The engine serves the LoRA deltas folded into the base weights
  (``engines.hf._lora_fold``): the update unfolds them first and folds the
  new ones after, inside the same lock. All of it runs on the engine's
  worker thread (``engine.on_worker``), the one thread that runs torch on
  that model: on CPU a second long-lived torch thread makes both slower
  (``engines.hf._worker`` has the measurements).
  Turns in flight when the update is due: with ``partial_rollouts`` the
  update runs between two decode steps and those turns continue under the
  new weights, each token labelled with the version that produced it;
  without, the update waits until the engine has finished the turns it is
  decoding (admitting no new one meanwhile: ``on_worker(drain=True)``), so
  every turn is one version's. The wait is ``time/update_wait``.
- ``PushedWeights``: the engine lives elsewhere (a vLLM server, another
  process). Each new version is saved as an adapter folder
  (``<run_dir>/adapters/v<N>``) and handed over with
  ``await engine.load_adapter(folder, N)``; older folders are removed.
  Training steps and saves run on one thread of their own, for the same
  reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from ..run_folder import RunFolder
from ..types import LoadsRoleAdapters, PolicyEngine, Sample, SharedModelEngine
from ._roles import RoleUpdates
from .distributed import ShardedUpdate
from .update import PolicyUpdate


@runtime_checkable
class WeightSync(Protocol):
    """How each trained version reaches the engine that serves the policy: ``SharedWeights`` or ``PushedWeights``.

    ``apply`` trains one step on ``update`` and makes the engine serve the
    result; ``publish`` makes the engine serve what ``update`` holds now (a
    resume, initial weights); ``close`` releases what the strategy started.
    """

    update: PolicyUpdate | ShardedUpdate

    async def apply(self, samples: Sequence[Sample]) -> dict[str, float]: ...

    async def publish(self) -> None: ...

    def close(self) -> None: ...


def shares_model(engine: Any) -> bool:
    """True when the engine is a ``SharedModelEngine`` with a model: the trainer can train the model it serves."""
    return isinstance(engine, SharedModelEngine) and engine.model is not None


class SharedWeights:
    """The engine and the trainer hold the same model object (see the module docstring)."""

    def __init__(self, engine: SharedModelEngine, update: PolicyUpdate, partial_rollouts: bool = False) -> None:
        self.engine = engine
        self.update = update
        self.partial_rollouts = partial_rollouts  # see the module docstring
        engine.on_worker_sync(self._fold_again)

    def _unfolded(self) -> Any:
        """The engine's model unfolded (as peft computes it) inside, folded again after; a no-op context
        for an engine that does not fold."""
        fold = self.engine.lora_fold
        return fold.unfolded() if fold is not None else contextlib.nullcontext()

    def _fold_again(self) -> None:
        """Fold the adapter as the trainer holds it now (after an update, or weights restored in place)."""
        with self.engine.weights_lock, self._unfolded():
            pass

    def _step(self, samples: Sequence[Sample], queued: float) -> dict[str, float]:
        waited = time.perf_counter() - queued  # decode steps (partial rollouts) or whole turns (drained) before it
        # re-entrant: the update takes the same lock; it trains base + LoRA, never folded weights
        with self.engine.weights_lock:
            with self._unfolded():
                metrics = self.update.step(samples)
            self.engine.set_policy_version(self.update.version)
        return {**metrics, "time/update_wait": waited}

    async def apply(self, samples: Sequence[Sample]) -> dict[str, float]:
        queued = time.perf_counter()
        return await self.engine.on_worker(lambda: self._step(samples, queued), drain=not self.partial_rollouts)

    async def publish(self) -> None:
        """Make the engine's version the trainer's (after a resume restored the weights in place)."""
        def fold_and_set() -> None:
            self._fold_again()
            self.engine.set_policy_version(self.update.version)

        await self.engine.on_worker(fold_and_set)

    def close(self) -> None:
        """Nothing to release: the engine owns the thread."""


class PushedWeights:
    """The engine loads every new version from an adapter folder (see the module docstring)."""

    def __init__(self, engine: PolicyEngine, update: PolicyUpdate | ShardedUpdate | RoleUpdates, run_dir: str | Path,
                 keep: int = 2) -> None:
        self.engine = engine
        self.update = update
        self.folder = RunFolder(run_dir).pushed_adapters
        self.keep = keep
        self._published: list[Path] = []
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtrl-update")  # see the module docstring

    async def _on_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def apply(self, samples: Sequence[Sample]) -> dict[str, float]:
        before = self.update.version
        metrics = await self._on_thread(self.update.step, samples)
        if self.update.version != before:
            await self.publish()
        return metrics

    async def publish(self) -> None:
        version = int(self.update.version)
        target = self.folder / f"v{version}"
        if isinstance(self.update, RoleUpdates):  # each role's adapter, loaded by its name
            if not isinstance(self.engine, LoadsRoleAdapters):
                raise TypeError(f"{type(self.engine).__name__} cannot load an adapter per role (types.LoadsRoleAdapters)")
            saved = await self._on_thread(self.update.save_weights, target)
            await self.engine.load_role_adapters({role: str(path) for role, path in saved.items()}, version)
        else:
            await self._on_thread(self.update.policy.save_weights, target)
            await self.engine.load_adapter(str(target), version)
        self._published.append(target)
        for old in self._published[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._published = self._published[-self.keep :]

    def close(self) -> None:
        """End the update thread (after the step it is running, if any)."""
        self._thread.shutdown(wait=True)


__all__ = ["PushedWeights", "SharedWeights", "WeightSync", "shares_model"]
