"""Reading a small data file a user names (a judge spec, an engine script): JSON by its suffix, else YAML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_data_file(path: str | Path, error: type[Exception], missing: str, unparsable: str) -> tuple[Path, Any]:
    """The file and its parsed data; ``error`` naming it (``missing: 'path' is not a file``, ``unparsable file:
    cannot parse: ...``) when it is absent or is not JSON (``.json``) / YAML (any other suffix)."""
    file = Path(path)
    if not file.is_file():
        raise error(f"{missing}: {str(path)!r} is not a file")
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix == ".json":
            return file, json.loads(text)
        import yaml

        return file, yaml.safe_load(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        raise error(f"{unparsable} {file}: cannot parse: {exc}") from None
