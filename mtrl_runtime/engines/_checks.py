"""Request checks every engine applies before generating, and the arguments of an adapter load, naming the
field and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ..types import GenerationRequest


def check_request(request: GenerationRequest, vocab_size: int | None = None) -> None:
    """Reject an empty or out-of-range prompt and sampling settings no engine can honour."""
    ids, s = request.prompt_ids, request.sampling
    if not ids:
        raise ValueError("prompt_ids: must not be empty")
    low, high = min(ids), max(ids)
    if low < 0:
        raise ValueError(f"prompt_ids: token id {low} is negative")
    if vocab_size is not None and high >= vocab_size:
        raise ValueError(f"prompt_ids: token id {high} is outside [0, {vocab_size})")
    if s.max_tokens < 1:
        raise ValueError(f"sampling.max_tokens: must be >= 1, got {s.max_tokens}")
    if s.temperature < 0:
        raise ValueError(f"sampling.temperature: must be >= 0, got {s.temperature}")
    if not 0 < s.top_p <= 1:
        raise ValueError(f"sampling.top_p: must be in (0, 1], got {s.top_p}")
    if s.top_logprobs < 0:
        raise ValueError(f"sampling.top_logprobs: must be >= 0, got {s.top_logprobs}")


def role_adapter_folders(paths: Mapping[str, str], version: int) -> dict[str, Path]:
    """``load_role_adapters``' arguments checked (``types.LoadsRoleAdapters``): each role's folder, resolved, holds a
    peft adapter; ``version`` is an int >= 0."""
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"version: expected an int >= 0, got {version!r}")
    if not paths:
        raise ValueError("paths: name at least one role's adapter folder")
    folders = {}
    for role, path in paths.items():
        folder = Path(path).resolve()
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"paths[{role!r}]: {str(path)!r} holds no adapter_config.json")
        folders[role] = folder
    return folders


__all__ = ["check_request", "role_adapter_folders"]
