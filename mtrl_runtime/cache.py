"""mtrl's cache folder on this machine: ``$MTRL_CACHE``, else ``~/.cache/mtrl``.

What lives there (docs/modules.md): converted models (``models/``, the
engines), the tokenizer classes chosen per folder (``tokenizers/``), migrated
empty MLflow stores (``mlflow/``, ``tracking``). On the floor, so that any
package may name it.
"""

from __future__ import annotations

import os
from pathlib import Path


def mtrl_cache_root() -> Path:
    """mtrl's cache folder: ``$MTRL_CACHE``, else ``~/.cache/mtrl``."""
    return Path(os.environ.get("MTRL_CACHE") or "~/.cache/mtrl").expanduser()


__all__ = ["mtrl_cache_root"]
