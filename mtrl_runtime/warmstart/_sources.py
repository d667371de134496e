"""Where warm-start conversations come from: a registry of importers, name -> ``module:function``.

Each importer is ``load(path: Path) -> list[Conversation]`` and raises a
ValueError naming the file, the record and the field it could not read.
Importers are resolved on first use, so naming one imports nothing else.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from ._conversation import Conversation

Importer = Callable[[Path], "list[Conversation]"]

# name -> module (inside this package) and function
SOURCES: dict[str, str] = {
    "openai": "._openai_jsonl:load",  # OpenAI-format conversation JSONL ({"messages": [...], "tools": [...]})
    "mlflow": "._mlflow_traces:load",  # MLflow traces (mtrl's own, and OpenAI / LangChain autologging's)
    "otel": "._otel_spans:load",  # OpenTelemetry GenAI spans exported as JSON (OTLP JSON)
}


def importer(name: str) -> Importer:
    """The importer named ``name``; a ValueError listing the known names otherwise."""
    if name not in SOURCES:
        raise ValueError(f"source: unknown trace source {name!r}; known: {', '.join(sorted(SOURCES))}")
    module, _, function = SOURCES[name].partition(":")
    return getattr(importlib.import_module(module, __package__), function)
