"""What every engine reports: the counters it keeps, and the error of a request to a closed engine."""

from __future__ import annotations

from dataclasses import dataclass, field


class EngineClosedError(RuntimeError):
    """The engine was closed before (or while) serving the request."""


@dataclass
class EngineStats:
    """Counters the worker keeps (read them for benchmarks and tests)."""

    generations: int = 0
    tokens: int = 0
    prefill_passes: int = 0
    decode_passes: int = 0
    rows_decoded: int = 0  # sum of batch sizes over decode passes
    decode_s: float = 0.0  # wall seconds in decode passes (rows_decoded / decode_s: decode tokens/s)
    max_rows: int = 0
    joins: int = 0  # prefills merged into an already running batch
    adapter_mismatches: int = 0  # requests for a policy version other than the one served
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    prefill_tokens: int = 0  # tokens computed by prefill passes (shared prefixes once, padding not counted)
    prefix_hit_tokens: int = 0  # prompt tokens whose KV came from a stored or shared prefix
    shared_prefix_passes: int = 0  # decode passes whose rows held their common prompt prefix once (hf engine)
    shared_prefix_columns_saved: int = 0  # KV columns those passes did not hold per row: (rows - 1) x prefix length
    base_rows_decoded: int = 0  # rows decoded with the adapter switched off (``GenerationRequest.base_model``)
    mixed_passes: int = 0  # decode passes holding base-model rows beside the adapter's
    repins: int = 0  # rollouts moved to another server because theirs left rotation (their prefix cache lost)
    servers: list["ServerStats"] = field(default_factory=list)  # one per server of a pool (vllm servers: N / urls)

    @property
    def prefix_hit_rate(self) -> float:
        """Share of admitted prompt tokens that were not prefilled for their own row."""
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class ServerStats:
    """One server of an engine pool: its requests, those in flight, the rollouts pinned to it, whether it serves."""

    name: str
    url: str = ""
    requests: int = 0  # requests sent to it
    in_flight: int = 0  # requests it is answering now
    pinned: int = 0  # rollouts pinned to it now
    repins: int = 0  # rollouts re-pinned onto it after their server left rotation (their prefix cache lost)
    failures: int = 0  # requests that failed on it
    live: bool = True  # in rotation
    down_reason: str | None = None  # why it left rotation (its death, a failed adapter load)


__all__ = ["EngineClosedError", "EngineStats", "ServerStats"]
