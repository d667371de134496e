"""The ``scripted`` engine's registry factory: ``create(model, script=..., script_file=...)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ._engine import Script, ScriptedEngine
from ._script_file import load_script_file


def create(
    model: str | None,
    *,
    script: Script | None = None,
    script_file: str | Path | None = None,
    tokenizer: Any = None,
    fail_turns: Sequence[int] = (),
    delay_s: float = 0.0,
    context_length: int | None = None,
    token_delay_s: float = 0.0,
) -> ScriptedEngine:
    """A scripted engine. ``script_file``: a JSON/YAML script (``_script_file``); ``script``: replies or a callable.

    Tokenizer: given, else ``model``'s, else the tiny test tokenizer. Without
    a script every turn answers ``DONE``.
    """
    if script is not None and script_file is not None:
        raise ValueError("script_file: give a script or a script file, not both")
    if script_file is not None:
        script = load_script_file(script_file)
    if tokenizer is None and model is not None:
        from .._loading import resolve_model
        from .._tokenizer import load_tokenizer

        tokenizer = load_tokenizer(resolve_model(model))
    if tokenizer is None:
        from ...testing import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    engine = ScriptedEngine(tokenizer, script if script is not None else (lambda request, prompt: "DONE"),
                            fail_turns=fail_turns, delay_s=delay_s, context_length=context_length,
                            token_delay_s=token_delay_s)
    source = f"script {script_file}" if script_file is not None else (
        "a script given in code" if script is not None else "every reply 'DONE'")
    tokens = f"tokenizer of {model}" if model is not None and tokenizer is None else "given/tiny tokenizer"
    engine.served_model = f"scripted ({source}; {tokens}; no model runs)"
    return engine


__all__ = ["create"]
