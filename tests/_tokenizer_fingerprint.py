"""What a loaded tokenizer is, as JSON: for tests that compare two ways of loading one folder.

Run as a script (``python _tokenizer_fingerprint.py CACHE FOLDER...``) it loads
each folder with ``mtrl_runtime.engines.load_tokenizer`` and prints one JSON
object: the fingerprints, and which heavy modules the process imported.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MESSAGES = [
    {"role": "system", "content": "You inspect aircraft."},
    {"role": "user", "content": "Inspect N388HR, then answer."},
    {"role": "assistant", "content": "Step 1 done.\nThe answer is 42."},
    {"role": "user", "content": "And the decision?"},
]
TOOLS = [{"type": "function", "function": {"name": "validate_aircraft", "description": "Check the registration.",
                                           "parameters": {"type": "object",
                                                          "properties": {"tail_number": {"type": "string"}},
                                                          "required": ["tail_number"]}}}]
TEXTS = ["Inspect aircraft N388HR (pre-flight check) and decide release or ground.",
         " leading space, trailing space ", "ünïcödé — ok ✓ 42", "tabs\tand\nnew lines\n\n"]


def fingerprint(tokenizer: Any) -> dict[str, Any]:
    """The class, the whole tokenizers pipeline, added and special tokens, template, ids and renders."""
    specials = " ".join(tokenizer.all_special_tokens)
    texts = TEXTS + [specials + " " + TEXTS[0]]
    out: dict[str, Any] = {
        "class": f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}",
        "pipeline": json.loads(tokenizer.backend_tokenizer.to_str()),
        "added": {str(i): repr(t) for i, t in tokenizer.added_tokens_decoder.items()},
        "specials": [tokenizer.all_special_tokens, tokenizer.all_special_ids],
        "ids": {name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                            "unk_token_id")},
        "sizes": [len(tokenizer), tokenizer.vocab_size, tokenizer.model_max_length],
        "sides": [tokenizer.padding_side, tokenizer.truncation_side],
        "chat_template": tokenizer.chat_template,
        "encoded": [tokenizer.encode(t) for t in texts],
        "encoded_plain": [tokenizer.encode(t, add_special_tokens=False) for t in texts],
        "decoded": [tokenizer.decode(tokenizer.encode(t)) for t in texts],
    }
    renders = {}
    for name, kwargs in {"plain": {}, "tools": {"tools": TOOLS}}.items():
        try:
            renders[name] = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False,
                                                          **kwargs)
        except Exception as err:  # a template may refuse a shape; both loads must refuse it alike
            renders[name] = f"{type(err).__name__}: {err}"
    out["renders"] = renders
    return out


def main(argv: list[str]) -> int:
    from pathlib import Path

    from mtrl_runtime.engines import load_tokenizer

    cache, folders = Path(argv[0]), argv[1:]
    prints = {folder: fingerprint(load_tokenizer(folder, cache_dir=cache)) for folder in folders}
    heavy = [m for m in ("transformers.models.auto.tokenization_auto", "transformers.models.auto.modeling_auto",
                         "transformers.generation", "sklearn", "torch") if m in sys.modules]
    print(json.dumps({"fingerprints": prints, "heavy": heavy}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
