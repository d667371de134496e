"""Log-probabilities of the chosen tokens, computed in chunks over the sequence.

The unchunked path projects every position the loss reads to the vocabulary
at once: [tokens x vocab] logits, an fp32 copy for the log-softmax, and
their gradient (152k vocab x 2k tokens x 4 B = 1.2 GB per copy). Here the
decoder runs once for the final hidden states [B, K, D] at the positions the
loss reads; then each chunk of ``chunk_tokens`` positions goes through the
LM head, log-softmax and the pick. Every chunk runs under non-reentrant
activation checkpointing: its forward keeps only its slice of the hidden
states (a view) and its [chunk] result, and its backward recomputes that
chunk's logits, so neither pass holds more than one chunk's logits. The
values and gradients are those of the unchunked path (to float error).

This needs a model whose logits are its output embedding applied to its
decoder's last hidden state (no logit soft-capping or scaling):
``splits_head`` checks it once on a few tokens.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.checkpoint import checkpoint


@runtime_checkable
class DecoderWithHead(Protocol):
    """A transformers causal LM: a decoder (hidden states) and an output embedding (the LM head)."""

    def get_decoder(self) -> Any: ...

    def get_output_embeddings(self) -> Any: ...


def causal_lm(model: Any) -> Any:
    """The transformers model under a peft wrapper (LoRA layers are injected in place, so it trains them)."""
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


def decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` of ``model`` (or of the model under its peft wrapper); None when it has no such split."""
    base = causal_lm(model)
    if not isinstance(base, DecoderWithHead):
        return None
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    if decoder is None or head is None:
        return None
    return decoder, head


def splits_head(model: Any, probe_ids: tuple[int, ...] = (1, 2, 3, 4)) -> bool:
    """Whether ``model``'s logits equal its LM head applied to its decoder's output (checked on a few tokens)."""
    parts = decoder_and_head(model)
    if parts is None:
        return False
    decoder, head = parts
    param = next(causal_lm(model).parameters())
    vocab = int(head.weight.shape[0])
    ids = torch.tensor([[i % vocab for i in probe_ids]], device=param.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full = model(input_ids=ids).logits.float()
            split = head(decoder(input_ids=ids).last_hidden_state).float()
    finally:
        model.train(was_training)
    return full.shape == split.shape and torch.allclose(full, split, rtol=1e-3, atol=1e-3)


def _chunk_nll(head: Any, hidden_ND: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
    logits_NV = head(hidden_ND)
    return torch.nn.functional.cross_entropy(logits_NV.float(), targets_N, reduction="none")


def chunked_logprobs(head: Any, hidden_BKD: torch.Tensor, targets_BK: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """log softmax(head(hidden))[target] per position, ``chunk_tokens`` positions at a time: [B, K] fp32."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    batch, kept, width = hidden_BKD.shape
    hidden_ND = hidden_BKD.reshape(batch * kept, width)
    targets_N = targets_BK.reshape(-1)
    grads = torch.is_grad_enabled() and (
        hidden_ND.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    run = functools.partial(_chunk_nll, head)
    pieces = []
    for start in range(0, batch * kept, chunk_tokens):
        h_cD, t_c = hidden_ND[start:start + chunk_tokens], targets_N[start:start + chunk_tokens]
        pieces.append(checkpoint(run, h_cD, t_c, use_reentrant=False) if grads else run(h_cD, t_c))
    nll = torch.cat(pieces) if pieces else hidden_ND.new_zeros(0, dtype=torch.float32)
    return -nll.view(batch, kept)


__all__ = ["DecoderWithHead", "causal_lm", "chunked_logprobs", "decoder_and_head", "splits_head"]
