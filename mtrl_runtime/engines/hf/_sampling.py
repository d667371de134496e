"""Next-token choice for a batch of rows, each with its own sampling parameters and generator.

The logprob returned for a token is the log-softmax of the RAW logits
(temperature 1, no top-p) at that token: the quantity the trainer
recomputes from the same weights. Temperature and top-p only change which
token is drawn. Each row draws its noise from its own ``torch.Generator``
and the draw depends on nothing but that row's logits and parameters, so a
seeded request gets the same tokens alone or inside any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSampling:
    """How one row picks its next token."""

    temperature: float  # 0: greedy
    top_p: float
    top_logprobs: int
    generator: torch.Generator


@dataclass(frozen=True)
class Choice:
    """The tokens picked for a batch, their raw logprobs and, per row, the top alternatives."""

    tokens_B: list[int]
    logprobs_B: list[float]
    top_B: list[tuple[tuple[int, float], ...] | None]


def choose_tokens(logits_BV: torch.Tensor, rows: list[RowSampling]) -> Choice:
    """Pick one token per row of ``logits_BV`` (B rows, V vocab) as ``rows`` say."""
    logprobs_BV = torch.log_softmax(logits_BV.float(), dim=-1)  # raw distribution: the trainer's quantity
    tokens_B = logprobs_BV.argmax(dim=-1)
    _draw(logits_BV, rows, tokens_B)
    chosen_B = logprobs_BV.gather(1, tokens_B[:, None])[:, 0]
    return Choice(tokens_B.tolist(), chosen_B.tolist(), _top_logprobs(logprobs_BV, rows))


def _draw(logits_BV: torch.Tensor, rows: list[RowSampling], tokens_B: torch.Tensor) -> None:
    """Sample, in place into ``tokens_B``, the rows with temperature > 0 (Gumbel-max).

    argmax(logits / T + Gumbel noise) draws from softmax(logits / T). Unlike
    an inverse CDF over a cumulative sum, it flips a choice only when the two
    best perturbed scores tie within float error, so batched and unbatched
    passes (logits equal to ~1e-6) pick the same tokens.
    """
    picked = [i for i, r in enumerate(rows) if r.temperature > 0]
    if not picked:
        return
    device = logits_BV.device
    index_S = torch.tensor(picked, device=device)
    temps_S = torch.tensor([rows[i].temperature for i in picked], device=device)
    rows_SV = logits_BV if len(picked) == len(rows) else logits_BV[index_S]
    scores_SV = rows_SV.float() / temps_S[:, None]
    top_p_S = torch.tensor([rows[i].top_p for i in picked], device=device)
    nucleus_S = top_p_S < 1.0
    if bool(nucleus_S.any()):
        sorted_SV, order_SV = torch.softmax(scores_SV, dim=-1).sort(dim=-1, descending=True)
        mass_before_SV = sorted_SV.cumsum(dim=-1) - sorted_SV
        drop_sorted_SV = (mass_before_SV >= top_p_S[:, None]) & nucleus_S[:, None]  # the top token always stays
        drop_SV = torch.zeros_like(drop_sorted_SV).scatter(1, order_SV, drop_sorted_SV)
        scores_SV = scores_SV.masked_fill(drop_SV, float("-inf"))
    noise_SV = torch.stack([_gumbel(scores_SV.shape[-1], rows[i].generator) for i in picked]).to(device)
    tokens_B[index_S] = (scores_SV + noise_SV).argmax(dim=-1)


def _gumbel(size: int, generator: torch.Generator) -> torch.Tensor:
    """Gumbel(0, 1) noise, -log(-log(u)), from a row's own generator.

    A uniform of exactly 0 (p = 2^-24 per token) gives -inf: that token is
    not drawn this step, where its true noise would have been far below the
    winner's anyway.
    """
    uniform = torch.rand(size, generator=generator, device=generator.device)
    return uniform.log_().neg_().log_().neg_()


def _top_logprobs(
    logprobs_BV: torch.Tensor, rows: list[RowSampling]
) -> list[tuple[tuple[int, float], ...] | None]:
    k_max = max((r.top_logprobs for r in rows), default=0)
    if k_max <= 0:
        return [None] * len(rows)
    values_BK, ids_BK = logprobs_BV.topk(min(k_max, logprobs_BV.shape[-1]), dim=-1)
    values, ids = values_BK.tolist(), ids_BK.tolist()
    return [
        tuple(zip(ids[b][: r.top_logprobs], values[b][: r.top_logprobs])) if r.top_logprobs > 0 else None
        for b, r in enumerate(rows)
    ]


__all__ = ["Choice", "RowSampling", "choose_tokens"]
