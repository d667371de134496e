"""A model folder's tokenizer, as ``AutoTokenizer`` loads it, without importing the model registry each time.

``AutoTokenizer`` chooses a folder's tokenizer class from its
``config.json`` and ``tokenizer_config.json`` (the model type's registered
class, the class the folder names, corrections for checkpoints known to
name the wrong one). Importing it imports transformers' model registry and
generation code, and through them scikit-learn and SciPy: about 10 s of
CPU on a 2-core machine, paid by every process that needs only the
tokenizer (the ``scripted`` engine's commands, the vLLM engine's
coordinator side, ``mtrl check template``).

``load_tokenizer(folder)`` asks ``AutoTokenizer`` the first time it meets a
folder and remembers the class it chose, keyed by the transformers version
and the name, size and modification time of every file in the folder;
later loads call that class's own ``from_pretrained`` (which is what
``AutoTokenizer`` calls once it has chosen). So the tokenizer is the same
object either way: same class, vocabulary, added tokens, pipeline and chat
template (``tests/test_tokenizer_loading.py`` compares them for every
model family the suite builds and for SmolLM2). A changed file or another
transformers version is a new key; a remembered class that no longer
imports or loads is asked of ``AutoTokenizer`` again. Classes from a
folder's own code (``auto_map``) are not remembered.

The entries are small JSON files under ``$MTRL_CACHE/tokenizers`` (default
``~/.cache/mtrl/tokenizers``), written atomically, so processes that load
the same folder at once agree.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ._loading import mtrl_cache_root


def tokenizer_cache_dir() -> Path:
    """Where the chosen classes are remembered: ``$MTRL_CACHE/tokenizers``, else ``~/.cache/mtrl/tokenizers``."""
    return mtrl_cache_root() / "tokenizers"


def load_tokenizer(folder: str | Path, cache_dir: Path | None = None) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(folder)`` returns, choosing its class once per folder state."""
    folder = Path(folder)
    entry = Path(cache_dir or tokenizer_cache_dir()) / f"{_folder_key(folder)}.json"
    remembered = _load_remembered(entry, folder)
    if remembered is not None:
        return remembered
    from transformers import AutoTokenizer  # loads the folder, or raises its own error

    tokenizer = AutoTokenizer.from_pretrained(folder)
    chosen = type(tokenizer)
    if chosen.__module__.startswith("transformers."):
        _remember(entry, {"module": chosen.__module__, "class": chosen.__qualname__})
    return tokenizer


def _folder_key(folder: Path) -> str:
    """A hash of the transformers version and every file's name, size and modification time in ``folder``."""
    folder = folder.resolve()
    files = []
    for path in sorted(folder.iterdir()):
        if path.is_file():
            stat = path.stat()
            files.append((path.name, stat.st_size, stat.st_mtime_ns))
    state = {"transformers": importlib.metadata.version("transformers"), "folder": str(folder), "files": files}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:40]


def _load_remembered(entry: Path, folder: Path) -> Any:
    """``folder``'s tokenizer loaded by the class ``entry`` names, or None: no entry, an unreadable one, or a
    class that no longer imports or loads the folder (then AutoTokenizer is asked again)."""
    try:
        named = json.loads(entry.read_text())
        return getattr(importlib.import_module(named["module"]), named["class"]).from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        return None


def _remember(entry: Path, named: dict[str, str]) -> None:
    """Write ``entry`` atomically. A cache that cannot be written costs the next process time, nothing else."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", dir=entry.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(named, out)
        os.replace(tmp, entry)
    except OSError:
        return


__all__ = ["load_tokenizer", "tokenizer_cache_dir"]
