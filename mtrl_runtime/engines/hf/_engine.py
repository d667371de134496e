"""The ``hf`` engine: transformers in-process, with concurrent requests decoded in shared batches.

A worker thread owns the model (``_worker``). ``generate`` enqueues a job and
awaits its future; between decode steps the worker admits queued jobs into
the running batch (continuous batching, see ``_decoding``), samples one
token per row, and resolves the rows that finished. Other torch work on the
model runs on the same thread through ``on_worker`` / ``on_worker_sync``
(``_worker`` says why that matters for speed on CPU).

Semantics worth knowing:

- ``Generation.logprobs`` are log-softmax of the raw logits (temperature 1,
  no top-p) at each sampled token: what the trainer recomputes.
- ``completion_ids`` end with the eos token, a ``request.stop_token_ids``
  token (the chat format's, e.g. gpt-oss ``<|call|>``), or the token that
  completed a stop string (the stop string is not stripped here; the
  endpoint cuts the text).
- ``Generation.policy_version`` is the version in effect when the request
  was prefilled; ``Generation.token_versions`` the version of the forward
  pass behind each token when a new version arrived mid-turn (a partial
  rollout; None when all are the first one's). ``request.adapter``: this engine serves only its current
  weights; a request for another version is served with the current one
  (counted in ``stats.adapter_mismatches``), and the Generation says so.
- ``request.role`` (``types.ServesRoles``): the row decodes with the LoRA
  adapter of that name (one per role, ``mtrl_runtime.roles``) in the same
  batches as rows of the other roles (``_lora_fold.rows_as``); each role's
  prompts are cached apart. The adapters are a trainer's (it adds one per
  role to the shared model) or saved folders loaded by
  ``load_role_adapters`` (``types.LoadsRoleAdapters``: ``mtrl eval`` of a
  run with roles).
- ``generate_stream`` (``types.StreamingEngine``): the worker hands each
  sampled token to the request's event loop (``loop.call_soon_threadsafe``)
  in the decode step that sampled it; the row batches as any other, and the
  final ``Generation`` is the one ``generate`` would return.

Two ways to follow the trainer, use one: ``load_adapter(path, version)``
loads a saved peft adapter onto the engine's own model; or an in-process
trainer shares ``engine.model``, changes its weights while holding
``weights_lock`` (every forward pass of the worker holds it), then calls
``set_policy_version``. Rows in flight keep their KV cache across such an
update, so their remaining tokens come from the new weights (each token
labelled with its version); ``on_worker(fn, drain=True)`` instead runs the
update once the running rows have finished, admitting none meanwhile. The shared
model must stay in eval mode (or have no dropout) while the engine serves.

LoRA folding (``lora_fold``, see ``_lora_fold``): while the engine serves,
each LoRA layer's delta is folded into its base weight, so a decode step
costs what the base model's does. A trainer sharing the model unfolds it
(``lora_fold.unfold()``, under ``weights_lock``, on the worker through
``on_worker``) before it trains and folds it again after; ``load_adapter``
does the same around a load.

Prefix caching (``prefix_cache_tokens``, default 32768; 0 disables): the KV
of prompts, of stretches concurrent prompts share, and of finished rows'
prompt + completion stays in a token-bounded LRU tree (``_prefix_cache``);
a request prefills only what follows the longest stretch held there
(``_prefix_prefill``). KV is valid only for the weights that computed it:
the cache is cleared, under ``weights_lock``, by ``set_policy_version``, any
assignment to ``policy_version`` (``evaluation.base_policy`` does one),
``load_adapter`` and ``invalidate_prefix_cache``. A trainer that changes the
shared weights calls one of them before releasing the lock; a row prefilled
before a clear never stores its KV (the cache's epoch moved on).

Shared prompt prefix (``share_prefix``, default on; only where the engine's
CPU attention runs, see ``_attention``): rows that open with the same
tokens (an agent's system prompt) hold that prefix's KV once and attend to
it as one matrix (``_shared_prefix``), where each row would otherwise read
its own copy every decode step. Same tokens and logprobs up to float
summation order (fp32: within 1e-5 in the tests).

KV during decoding (``kv_cache``, default ``auto``): transformers'
per-step concatenation (``concat``), ``preallocated`` buffers a step writes
one column into, ``padded`` ones whose attention reads the whole buffer
(its room masked: bf16 matmuls need contiguous tensors), or ``auto``:
preallocated for fp32 on CPU, padded for bf16 on CPU, concat elsewhere
(GPUs are not measured: ``_kv_buffer`` and docs/performance.md give the
runs). All give the same tokens and logprobs up to float summation order
(identical in the tests and benches; a matmul over more columns may sum in
another order, and a bf16 rounding may then flip a token).

Linear layers on CPU (``cpu_linear``, default ``auto``): ``packed`` serves
every fp32 ``nn.Linear`` of an inference forward (bf16 too where the CPU
computes bf16 natively) from a oneDNN copy of its weight reordered once
(``_packed_linear``; one more copy of the linear weights, packed again after
any in-place change such as folding an adapter), ``aten`` leaves
``F.linear``, ``auto`` packs the weights of each shape where a probe on
the worker thread (a pass over up to 32 MiB of that shape's weights at 1
and 8 rows, cold where the model outgrows the CPU's last-level cache) says
oneDNN is at least 1.15x faster at 8 rows on this CPU, leaving forwards of
fewer than 4 rows to ``F.linear`` where a single row is faster there
(``packed_linears.plan``). Training forwards never use a packed copy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, TypeVar

from ...torch_support import plain_kv_cache
from ...types import Generation, GenerationRequest, TokenDelta
from .._checks import check_request, role_adapter_folders
from .._loading import resolve_model
from .._stats import EngineClosedError, EngineStats
from ._attention import use_short_query_attention
from ._jobs import Call, Job
from ._kv_buffer import resolve_kv_cache
from ._lora_fold import LoraFold
from ._packed_linear import CPU_LINEARS, PackedLinears, packing_plan
from ._prefix_cache import PrefixCache
from ._pretrained import auto_dtype, default_eos_ids, load_lora_adapter, load_pretrained
from ._worker import WorkerLoop

T = TypeVar("T")


@dataclass(frozen=True)
class HFServing:
    """How an ``HFEngine`` serves, whichever way its model came (``HFEngine(path, ...)``, ``from_objects``);
    the engine's keyword options, checked here."""

    max_batch_size: int = 32
    max_prefill_tokens: int = 16384
    eos_token_ids: list[int] | tuple[int, ...] | None = None  # None: the model's and tokenizer's own
    num_threads: int | None = None  # CPU threads of the worker only (OpenMP: per thread); None: torch's
    prefix_cache_tokens: int = 32768  # 0 disables the prefix cache
    kv_cache: str = "auto"  # how a decode batch holds its KV (see _kv_buffer)
    share_prefix: bool = True
    cpu_linear: str = "auto"

    def __post_init__(self) -> None:
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads: must be >= 1, got {self.num_threads}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {self.max_batch_size}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens: must be >= 1, got {self.max_prefill_tokens}")
        if not isinstance(self.prefix_cache_tokens, int) or self.prefix_cache_tokens < 0:
            raise ValueError(
                f"prefix_cache_tokens: must be an int >= 0 (0 disables), got {self.prefix_cache_tokens!r}")
        if not isinstance(self.share_prefix, bool):
            raise ValueError(f"share_prefix: must be true or false, got {self.share_prefix!r}")
        if self.cpu_linear not in CPU_LINEARS:
            raise ValueError(f"cpu_linear: expected one of {', '.join(CPU_LINEARS)}, got {self.cpu_linear!r}")


class HFEngine(WorkerLoop):
    """Transformers model served in-process with batched decoding (see the module docstring).

    ``serving``: the fields of ``HFServing`` as keywords (batch sizes, threads, caches, linear layers).
    """

    name = "hf"

    def __init__(self, model_path: str | Path, *, device: str = "cpu", dtype: str = "auto", **serving: Any) -> None:
        options = HFServing(**serving)
        if dtype == "auto":
            dtype = auto_dtype(device)
        model, tokenizer = load_pretrained(Path(model_path), dtype, device)
        self._setup(model, tokenizer, options)

    @classmethod
    def from_objects(cls, model: Any, tokenizer: Any, **serving: Any) -> "HFEngine":
        """Serve an already built model (its device and dtype as they are), e.g. the tiny test model."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, HFServing(**serving))
        return engine

    def _setup(self, model: Any, tokenizer: Any, serving: HFServing) -> None:
        self.kv_cache = resolve_kv_cache(serving.kv_cache, model)  # how a decode batch holds its KV (see _kv_buffer)
        self._model = model
        self.tokenizer = tokenizer
        self.weights_lock = threading.RLock()
        # None when disabled, or when the model's cache has layers (sliding windows, ...) KV cannot be cut from
        cached = serving.prefix_cache_tokens
        self._prefix = PrefixCache(cached) if cached and plain_kv_cache(model) else None
        self._variant_prefixes: dict[str, PrefixCache] = {}  # base-model rows', each role's (``_worker._prefix_for``)
        self.policy_version = 0
        self.stats = EngineStats()
        self.max_batch_size = serving.max_batch_size
        self.max_prefill_tokens = serving.max_prefill_tokens
        self.num_threads = serving.num_threads  # CPU threads of the worker only (OpenMP: per thread); None: torch's
        eos = serving.eos_token_ids
        self.eos_token_ids = frozenset(default_eos_ids(model, tokenizer) if eos is None else eos)
        self.device = next(model.parameters()).device
        own_attention = use_short_query_attention(model)  # on CPU: decode steps 2.6x faster than SDPA (_attention)
        self.share_prefix = serving.share_prefix and own_attention  # only that attention reads a shared prefix
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.context_length = int(getattr(model.config, "max_position_embeddings", None) or 1 << 30)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._queue: queue.SimpleQueue[Job | Call | None] = queue.SimpleQueue()
        self._state_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._adapter_name: str | None = None  # the adapter this engine loaded (never one a trainer added)
        self._adapters_loaded = 0
        self.lora_fold = LoraFold(model)  # the served model's LoRA deltas in its base weights (see above)
        # decode's linear layers through oneDNN with reordered weights where that pays on this CPU (_packed_linear);
        # the probe times matmuls, so it runs on the worker: on this thread it would start a second OpenMP team
        # and throttle every decode step after it (_worker's docstring)
        plan = self.on_worker_sync(lambda: packing_plan(model)) if serving.cpu_linear == "auto" else None
        pack = serving.cpu_linear == "packed" or bool(plan)
        self.packed_linears = PackedLinears(model, plan=plan) if pack else None  # plan None: every linear
        self.cpu_linear = "packed" if pack else "aten"

    # ------------------------------------------------------------------ public API
    @property
    def model(self) -> Any:
        """The model the worker runs (a peft model once an adapter is loaded)."""
        return self._model

    @property
    def policy_version(self) -> int:
        """The version the current weights are; setting it clears the prefix cache (see the module docstring)."""
        return self._policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        with self.weights_lock:
            self._policy_version = version
            self.invalidate_prefix_cache()

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The stored prefixes (None when prefix caching is off)."""
        return self._prefix

    def invalidate_prefix_cache(self) -> None:
        """Drop every stored prefix (the base model's rows' too): call after changing the weights without
        setting a version."""
        if self._prefix is not None:
            with self.weights_lock:
                self._prefix.clear()
                for cache in list(self._variant_prefixes.values()):  # the worker may add one meanwhile
                    cache.clear()

    def mixes_base_rows(self) -> bool:
        """Whether a ``base_model`` request can be served beside the adapter's (``types.MixesBaseRows``): the
        model holds a LoRA adapter whose term can be taken off per row (``LoraFold.per_row``). Read without the
        weights lock (callers are event loops; the worker holds it for whole passes). A model that holds no LoRA
        adapter and has its weights as loaded (policy version 0) is the base model: every row is a base row."""
        return self.lora_fold.per_row() or (not self.lora_fold.adapters() and self.policy_version == 0)

    def serves_roles(self) -> frozenset[str]:
        """The roles whose requests it serves (``types.ServesRoles``): the LoRA adapters its model holds by name,
        each row decoded with its role's adapter beside rows of the others in one batch (``_lora_fold.rows_as``)."""
        return self.lora_fold.adapters() if self.lora_fold.per_row() else frozenset()

    def set_policy_version(self, version: int) -> None:
        """Record that the shared weights now are policy ``version`` (in-process trainer); clears the prefix cache."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: expected an int >= 0, got {version!r}")
        self.policy_version = version

    async def generate(self, request: GenerationRequest) -> Generation:
        self._check_request(request)
        job = Job(request, asyncio.get_running_loop())
        self._submit(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops the row at its next step
            raise

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]:
        """Each token as the worker samples it (``types.StreamingEngine``), then the whole ``Generation``.

        The row decodes in the shared batch like any other; closing the
        iterator early drops it at the worker's next step.
        """
        self._check_request(request)
        job = Job(request, asyncio.get_running_loop(), stream=True)
        self._submit(job)
        assert job.tokens is not None
        try:
            while (item := await job.tokens.get()) is not None:
                yield TokenDelta((item[0],), (item[1],))
            yield await job.future
        finally:
            if not job.future.done():
                job.cancelled = True

    async def load_adapter(self, path: str, version: int) -> None:
        """Load the peft LoRA adapter folder ``path`` onto the base model as policy ``version``."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: expected an int >= 0, got {version!r}")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter path {str(path)!r}: no adapter_config.json there")
        await self.on_worker(lambda: self._swap_adapter(folder, version))

    async def load_role_adapters(self, paths: Mapping[str, str], version: int) -> None:
        """Load each role's peft LoRA folder (``{role: path}``, ``types.LoadsRoleAdapters``) as the adapter named by
        the role, as policy ``version``: a role's rows then decode with its own (``request.role``). An adapter of the
        same name is replaced; one this engine loaded by ``load_adapter`` is dropped."""
        folders = role_adapter_folders(paths, version)
        await self.on_worker(lambda: self._swap_role_adapters(folders, version))

    async def on_worker(self, fn: Callable[[], T], *, drain: bool = False) -> T:
        """Run ``fn()`` on the worker thread between decode steps and return its result (or raise its error).

        For torch work on this engine's model from elsewhere: a training step
        on the shared weights, an adapter switch. ``_worker`` says why it must
        not run on another long-lived thread. ``drain``: wait until no row is
        being decoded (admitting none meanwhile), so a weight change made by
        ``fn`` never reaches a turn in flight (partial rollouts off). Raises
        ``EngineClosedError`` once the engine is closed.
        """
        if threading.current_thread() is self._thread:
            return fn()
        return await asyncio.wrap_future(self._call(fn, drain))

    def on_worker_sync(self, fn: Callable[[], T]) -> T:
        """``on_worker`` for callers outside an event loop: blocks until ``fn`` ran on the worker."""
        if threading.current_thread() is self._thread:
            return fn()
        return self._call(fn).result()

    def _call(self, fn: Callable[[], Any], drain: bool = False) -> concurrent.futures.Future:
        call = Call(fn, drain)
        self._submit(call)
        return call.future

    async def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(thread.join)
        self._fail_queued(EngineClosedError("the hf engine is closed"))

    # ------------------------------------------------------------------ caller side
    def _check_request(self, request: GenerationRequest) -> None:
        check_request(request, self.vocab_size)
        if request.base_model and not self.mixes_base_rows():
            raise ValueError("base_model: this engine's model holds no LoRA adapter it can switch off per row "
                             "(none loaded and its weights changed since they were loaded, or one of another kind); "
                             "evaluate its base model on its own instead")
        if request.role is not None and not request.base_model and request.role not in self.serves_roles():
            raise ValueError(f"role: {request.role!r} names no LoRA adapter this engine's model holds "
                             f"({sorted(self.serves_roles())!r}); a run with roles adds one per role (RoleUpdates)")
        if len(request.prompt_ids) >= self.context_length:
            raise ValueError(
                f"prompt_ids: {len(request.prompt_ids)} tokens leave no room in the context of {self.context_length}"
            )

    def _submit(self, job: Job | Call) -> None:
        """Queue ``job``, starting the worker on first use (under the lock close() takes)."""
        with self._state_lock:
            if self._closed:
                raise EngineClosedError("the hf engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="mtrl-hf-engine", daemon=True)
                self._thread.start()
            self._queue.put(job)

    def _fail_queued(self, error: BaseException) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.settle(None, error)

    def _swap_adapter(self, folder: Path, version: int) -> None:
        """Load the adapter under the weights lock, make it active, drop the one it replaces."""
        self._adapters_loaded += 1
        name = f"policy-v{version}-{self._adapters_loaded}"
        with self.weights_lock, self.lora_fold.unfolded():
            self._model = self.lora_fold.model = load_lora_adapter(self._model, folder, name,
                                                                   replaces=self._adapter_name)
            self._adapter_name = name
            self.policy_version = version  # clears the prefix cache

    def _swap_role_adapters(self, folders: Mapping[str, Path], version: int) -> None:
        """Load every role's adapter by its name under the weights lock; the first role's is the active one."""
        with self.weights_lock, self.lora_fold.unfolded():
            model = self._model
            for role, folder in folders.items():
                if role in self.lora_fold.adapters():
                    model.delete_adapter(role)
                model = self.lora_fold.model = load_lora_adapter(model, folder, role)
            model.set_adapter(next(iter(folders)))
            if self._adapter_name is not None and self._adapter_name not in folders:
                model.delete_adapter(self._adapter_name)
            self._model, self._adapter_name = model, None
            self.policy_version = version  # clears the prefix caches, each role's too


def create(
    model: str | None,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    max_batch_size: int = 32,
    max_prefill_tokens: int = 16384,
    eos_token_ids: list[int] | None = None,
    num_threads: int | None = None,
    cache_dir: str | None = None,
    prefix_cache_tokens: int = 32768,
    kv_cache: str = "auto",
    share_prefix: bool = True,
    cpu_linear: str = "auto",
) -> HFEngine:
    """The ``hf`` factory: resolve ``model`` (folder, alias, cached hub id) and load it."""
    if model is None:
        raise ValueError("model: the hf engine needs a model (a local folder, a cached hub id or 'smollm2-135m')")
    folder = resolve_model(model, Path(cache_dir) if cache_dir else None)
    return HFEngine(folder, device=device, dtype=dtype, max_batch_size=max_batch_size,
                    max_prefill_tokens=max_prefill_tokens, eos_token_ids=eos_token_ids, num_threads=num_threads,
                    prefix_cache_tokens=prefix_cache_tokens, kv_cache=kv_cache, share_prefix=share_prefix,
                    cpu_linear=cpu_linear)


__all__ = ["HFEngine", "HFServing", "create"]
