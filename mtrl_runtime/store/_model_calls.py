"""Non-policy model calls in the store: validation and row encoding both backends share.

A ``ModelCall`` is a call an agent made to a model that is not the policy
(a judge, a planner): it passed through to its own endpoint and is kept
beside the rollout's turns so the trace stays whole. It is never a turn, so
no sample is ever built from it.
"""

from __future__ import annotations

from ..types import ModelCall
from ._checks import check_call, check_float, check_int, check_str

COLUMNS = (
    "rollout_id, seq, protocol, model, latency_s, started_at, input_tokens, output_tokens, stream, status, error"
)


def encode_model_call(call: ModelCall) -> tuple:
    """The row without its ``seq``, which the writer assigns (order of arrival per rollout)."""
    check_call("model_call", call, ModelCall)
    return (
        check_str("model_call.rollout_id", call.rollout_id),
        check_str("model_call.protocol", call.protocol),
        check_str("model_call.model", call.model, optional=True),
        check_float("model_call.latency_s", call.latency_s, minimum=0.0),
        check_float("model_call.started_at", call.started_at),
        check_int("model_call.input_tokens", call.input_tokens, optional=True),
        check_int("model_call.output_tokens", call.output_tokens, optional=True),
        int(bool(call.stream)),
        call.status,
        check_str("model_call.error", call.error, optional=True, empty=True),
    )


def decode_model_call(row: tuple) -> ModelCall:
    """A stored row (with its ``seq``) as a ``ModelCall``."""
    rollout_id, _seq, protocol, model, latency_s, started_at, input_tokens, output_tokens, stream, status, error = row
    return ModelCall(
        rollout_id=rollout_id, protocol=protocol, model=model, latency_s=latency_s, started_at=started_at,
        input_tokens=input_tokens, output_tokens=output_tokens, stream=bool(stream), status=status, error=error,
    )


__all__ = ["COLUMNS", "decode_model_call", "encode_model_call"]
