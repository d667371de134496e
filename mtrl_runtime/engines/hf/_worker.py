"""The hf engine's worker loop: what runs on the thread that owns the model.

One thread runs every forward pass of the engine, and every other torch
computation on the engine's model is handed to it (``HFEngine.on_worker``):
an in-process training step, folding the LoRA deltas, loading an adapter,
switching to the base model for an evaluation. Besides the weights lock this
is about CPU speed. torch's CPU kernels run in an OpenMP team per calling
thread (GNU OpenMP here), and a thread's team lives as long as the thread.
Once two long-lived threads each have had a team, the process holds more
OpenMP threads than there are cores, and libgomp then spins only briefly
between parallel regions (its documented rule, see ``GOMP_SPINCOUNT``; no
setting lifts it): every small op waits for its workers to wake up.
Measured on 2 cores (SmolLM2-135M, 8 rows x 64 tokens, LoRA folded): a
decode step took 58-67 ms after an adapter was loaded from another thread,
and 30 ms with the load on the worker. The same throttling slows a training
step run on yet another thread.

Between decode steps the worker runs queued calls, then admits queued jobs
into the running batch (continuous batching, see ``_decoding``), samples one
token per row, and resolves the rows that finished. A draining call
(``Call.drain``: an update without partial rollouts) is held until the
running rows have finished, and no job is admitted while one is held.
Each sampled token is labelled with the version of the forward pass that
computed its logits (``Row.logits_version``), so a row that crosses a
weight update reports both versions (``Generation.token_versions``).

Base-model rows (``GenerationRequest.base_model``) decode in the same batch
with the adapter's term taken off for them (``LoraFold.rows_as``);
their KV differs from the adapter's, so they are prefilled in a pass of
their own and their prompts are cached apart (``_prefix_for``); so are each role's rows (``rows_as``).
"""

from __future__ import annotations

import queue
import time
from collections import deque

import torch

from ...types import Generation, GenerationRequest
from .._stats import EngineClosedError
from ._decoding import DecodeBatch, Row
from ._jobs import Call, Job
from ._lora_fold import ACTIVE, BASE
from ._prefix_cache import PrefixCache
from ._prefix_prefill import prefill_rows, store_finished
from ._sampling import RowSampling, choose_tokens


def variant_of(request: GenerationRequest) -> str:
    """The weights a request's row decodes with (``_lora_fold``): the base model's, a role's adapter, or the
    adapter served now."""
    if request.base_model:
        return BASE
    return request.role if request.role is not None else ACTIVE


class WorkerLoop:
    """The worker-thread half of ``HFEngine`` (a mixin: it reads the engine's attributes)."""

    def _work(self) -> None:
        batch: DecodeBatch | None = None
        waiting: deque[Job] = deque()
        held: deque[Call] = deque()  # draining calls waiting for the running rows to finish
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)  # called in the worker thread: the caller's count is kept
        while self._pull(waiting, held, block=batch is None and not waiting and not held):
            while held and batch is None:
                held.popleft().run()
            try:
                with torch.inference_mode():
                    if not held:  # a draining call waits: the running rows finish, no new row joins them
                        batch = self._admit(batch, waiting)
                    batch = self._step(batch) if batch is not None else None
            except Exception as exc:  # a failed pass fails its rows; the engine keeps serving
                for row in batch.rows if batch is not None else ():
                    row.job.settle(None, exc)
                batch = None
        closed = EngineClosedError("the hf engine is closed")
        for job in [*(row.job for row in (batch.rows if batch else ())), *waiting, *held]:
            job.settle(None, closed)

    def _pull(self, waiting: deque[Job], held: deque[Call], block: bool) -> bool:
        """Run queued calls (hold draining ones), move queued jobs into ``waiting``; False once close() was called."""
        try:
            item = self._queue.get() if block else self._queue.get_nowait()
            while True:
                if item is None:
                    return False
                if isinstance(item, Call) and item.drain:
                    held.append(item)
                elif isinstance(item, Call):
                    item.run()  # outside inference mode: a training step needs autograd
                else:
                    waiting.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            return True

    def _admit(self, batch: DecodeBatch | None, waiting: deque[Job]) -> DecodeBatch | None:
        """Prefill waiting jobs that fit and merge them into ``batch``."""
        room = self.max_batch_size - (len(batch.rows) if batch else 0)
        if batch is not None and not batch.can_merge():
            room = 0
        jobs: list[Job] = []
        longest = 0
        while waiting and len(jobs) < room:
            if waiting[0].cancelled:
                waiting.popleft()
                continue
            longest_next = max(longest, self._tokens_to_prefill(waiting[0].request))
            if jobs and longest_next * (len(jobs) + 1) > self.max_prefill_tokens:
                break  # the padded prefill would exceed its token budget: the rest joins next step
            jobs.append(waiting.popleft())
            longest = longest_next
        if not jobs:
            return batch
        # each variant's rows (the adapter's, the base model's, each role's) prefilled in a pass of their own
        for variant in sorted({variant_of(job.request) for job in jobs}):
            group = [job for job in jobs if variant_of(job.request) == variant]
            batch = self._prefill_into(batch, group, variant)
        return batch

    def _prefill_into(self, batch: DecodeBatch | None, jobs: list[Job], variant: str) -> DecodeBatch | None:
        """Prefill ``jobs`` (all of one variant) and merge them into ``batch``."""
        cache = self._prefix_for(variant)
        try:
            rows = [self._row(job) for job in jobs]
            with self.weights_lock, self.lora_fold.rows_as(variant):  # every row of these passes
                for row in rows:
                    row.policy_version = row.logits_version = 0 if variant == BASE else self.policy_version
                    row.cache_epoch = cache.epoch if cache is not None else 0
                new = prefill_rows(self._model, rows, cache, self._pad_id, self.device, self.stats,
                                   kv_cache=self.kv_cache,
                                   share_prefix=self.share_prefix and batch is None)  # joiners: merge() plans
        except Exception as exc:  # these jobs fail; the running batch goes on
            for job in jobs:
                job.settle(None, exc)
            return batch
        self.stats.prefill_passes += 1
        if batch is None:
            return new
        batch.merge(new)
        self.stats.joins += 1
        return batch

    def _prefix_for(self, variant: str) -> PrefixCache | None:
        """The prefix cache of the adapter's rows, or of another variant's (the base model's, a role's): KV is
        valid only for the weights that computed it."""
        if variant == ACTIVE or self._prefix is None:
            return self._prefix
        if variant not in self._variant_prefixes:
            self._variant_prefixes[variant] = PrefixCache(self._prefix.max_tokens)
        return self._variant_prefixes[variant]

    def _tokens_to_prefill(self, request: GenerationRequest) -> int:
        """Prompt tokens past the longest stored prefix (an estimate: the cache may change before prefill)."""
        cache = self._prefix_for(variant_of(request))
        return len(request.prompt_ids) - (cache.match_length(request.prompt_ids) if cache is not None else 0)

    def _row(self, job: Job) -> Row:
        request, s = job.request, job.request.sampling
        generator = torch.Generator(device=self.device)
        if s.seed is None:
            generator.seed()
        else:
            generator.manual_seed(s.seed)
        if request.adapter is not None and request.adapter != self.policy_version:
            self.stats.adapter_mismatches += 1
        return Row(
            job=job,
            prompt_ids=tuple(request.prompt_ids),
            sampling=RowSampling(s.temperature, s.top_p, s.top_logprobs, generator),
            max_new=min(s.max_tokens, self.context_length - len(request.prompt_ids)),
            stop=tuple(s.stop),
            variant=variant_of(request),
        )

    def _step(self, batch: DecodeBatch) -> DecodeBatch | None:
        """Sample one token per row, resolve finished rows, run the next decode pass."""
        choice = choose_tokens(batch.logits_BV, [row.sampling for row in batch.rows])
        keep = []
        for i, row in enumerate(batch.rows):
            row.completion_ids.append(choice.tokens_B[i])
            row.logprobs.append(choice.logprobs_B[i])
            row.token_versions.append(row.logits_version)
            if choice.top_B[i] is not None:
                row.top_logprobs.append(choice.top_B[i])
            row.job.emit(choice.tokens_B[i], choice.logprobs_B[i])  # a streamed request gets it now
            reason = self._finish_reason(row)
            if row.job.cancelled:
                continue
            if reason is None:
                keep.append(i)
            else:
                self._resolve(row, reason)
                store_finished(self._prefix_for(row.variant), batch, i)
        batch.keep(keep)
        if not batch.rows:
            return None
        base_B = batch.base_rows_B()
        if base_B is not None:
            base_rows = int(base_B.sum())
            self.stats.base_rows_decoded += base_rows
            self.stats.mixed_passes += base_rows < len(batch.rows)
        variants_B = batch.variants_B()
        if variants_B is not None:
            self.stats.mixed_passes += 0 if base_B is not None else len(set(variants_B)) > 1
        with self.weights_lock, self.lora_fold.rows_as(variants_B):
            started = time.perf_counter()
            batch.decode(self._model, [row.completion_ids[-1] for row in batch.rows])
            self.stats.decode_s += time.perf_counter() - started
            for row in batch.rows:  # these logits are the weights' now: a new version mid-turn shows from here on
                row.logits_version = 0 if row.base else self.policy_version
        self.stats.decode_passes += 1
        if batch.prefixes:
            self.stats.shared_prefix_passes += 1
            self.stats.shared_prefix_columns_saved += sum((p.users - 1) * p.length for p in batch.prefixes)
        self.stats.rows_decoded += len(batch.rows)
        self.stats.max_rows = max(self.stats.max_rows, len(batch.rows))
        return batch

    def _finish_reason(self, row: Row) -> str | None:
        last = row.completion_ids[-1]
        if last in self.eos_token_ids or last in row.job.request.stop_token_ids:  # + the chat format's stop tokens
            return "stop"
        if row.stop:
            window = 4 * max(len(s) for s in row.stop) + 1  # a token holds >= 1 byte, a character <= 4
            tail = self.tokenizer.decode(row.completion_ids[-window:], skip_special_tokens=False)
            if any(s in tail for s in row.stop):
                return "stop"
        if len(row.completion_ids) >= row.max_new:
            return "length"
        return None

    def _resolve(self, row: Row, reason: str) -> None:
        self.stats.generations += 1
        self.stats.tokens += len(row.completion_ids)
        generation = Generation(
            completion_ids=tuple(row.completion_ids),
            logprobs=tuple(row.logprobs),
            finish_reason=reason,
            policy_version=row.policy_version,
            top_logprobs_T=tuple(row.top_logprobs) if row.sampling.top_logprobs > 0 else None,
            token_versions=(tuple(row.token_versions)
                            if any(v != row.policy_version for v in row.token_versions) else None),
        )
        row.job.settle(generation)


__all__ = ["WorkerLoop"]
