"""``load_tokenizer`` gives what ``AutoTokenizer`` gives, and, once it knows a folder, without its imports.

The folders: every chat format family's tiny tokenizer saved beside its
architecture's config, the same tokenizer under the class names real
checkpoints write in ``tokenizer_config.json`` (Qwen3's ``Qwen2Tokenizer``,
Llama 3's ``PreTrainedTokenizerFast``, ...; for some of these AutoTokenizer
keeps the named class, for others it overrides it), and SmolLM2 as mtrl
converts it. Each is compared by its whole fingerprint (class, tokenizers
pipeline, added and special tokens, template, ids, renders with and without
tools): first loaded in this process (the first load asks AutoTokenizer),
then in a fresh process that reads the remembered classes and must import
neither transformers' auto classes nor scikit-learn nor torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from _tokenizer_fingerprint import fingerprint
from mtrl_runtime.engines import load_tokenizer, resolve_model
from mtrl_runtime.engines._tokenizer import _folder_key
from mtrl_runtime.testing_formats import FAMILY_ARCHITECTURES, FAMILY_TOKENS, family_tokenizer

HERE = Path(__file__).resolve().parent
# (architecture, the class name tokenizer_config.json names): what real checkpoints of these families write
NAMED_CLASSES = [("qwen3", "Qwen2Tokenizer"), ("qwen3_moe", "Qwen2TokenizerFast"), ("llama", "PreTrainedTokenizerFast"),
                 ("llama", "LlamaTokenizerFast"), ("mistral", "LlamaTokenizer"), ("llama", "GPT2Tokenizer")]


def _save(folder: Path, tokenizer, arch: str, named_class: str | None = None) -> Path:
    tokenizer.save_pretrained(folder)
    AutoConfig.for_model(arch, vocab_size=len(tokenizer)).save_pretrained(folder)
    if named_class is not None:
        _name_class(folder, named_class)
    return folder


def _name_class(folder: Path, named_class: str) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = named_class
    path.write_text(json.dumps(config))


def _auto(folder: Path) -> dict:
    """AutoTokenizer's fingerprint of ``folder``, through JSON as the child process's comes."""
    return json.loads(json.dumps(fingerprint(AutoTokenizer.from_pretrained(folder))))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    made = [_save(root / name, family_tokenizer(name), FAMILY_ARCHITECTURES[name]) for name in FAMILY_TOKENS]
    hermes = family_tokenizer("hermes")
    made += [_save(root / f"{arch}-{named}", hermes, arch, named) for arch, named in NAMED_CLASSES]
    return made + [resolve_model("smollm2-135m")]


def test_every_family_loads_as_autotokenizer_loads_it_and_later_processes_skip_its_imports(folders, tmp_path):
    cache = tmp_path / "cache"
    classes = set()
    for folder in folders:
        auto = _auto(folder)
        classes.add(auto["class"])
        assert json.loads(json.dumps(fingerprint(load_tokenizer(folder, cache_dir=cache)))) == auto, folder.name
    # the folders cover both kinds of choice: the named class kept, and overridden
    assert len(classes) >= 4, classes
    assert len(list(cache.glob("*.json"))) == len(folders)

    child = subprocess.run([sys.executable, str(HERE / "_tokenizer_fingerprint.py"), str(cache), *map(str, folders)],
                           capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout)
    assert out["heavy"] == [], f"a remembered folder still imported {out['heavy']}"
    for folder in folders:
        assert out["fingerprints"][str(folder)] == _auto(folder), folder.name


def test_a_changed_file_is_a_new_key_and_the_class_follows_autotokenizers_new_choice(tmp_path):
    folder = _save(tmp_path / "qwen3", family_tokenizer("hermes"), "qwen3", "Qwen2Tokenizer")
    cache = tmp_path / "cache"
    first = load_tokenizer(folder, cache_dir=cache)
    assert type(first).__name__ == "Qwen2Tokenizer"
    key = _folder_key(folder)

    _name_class(folder, "GPT2Tokenizer")
    assert _folder_key(folder) != key
    again = load_tokenizer(folder, cache_dir=cache)
    assert type(again).__name__ == "GPT2Tokenizer"
    assert fingerprint(again) == fingerprint(AutoTokenizer.from_pretrained(folder))
    assert len(list(cache.glob("*.json"))) == 2


@pytest.mark.parametrize("entry", ['{"module": "transformers.no_such_module", "class": "Gone"}',
                                   '{"module": "transformers", "class": "NoSuchTokenizer"}', "not json"])
def test_an_entry_that_no_longer_loads_is_asked_of_autotokenizer_again_and_rewritten(tmp_path, entry):
    folder = _save(tmp_path / "llama", family_tokenizer("llama3_json"), "llama", "LlamaTokenizerFast")
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / f"{_folder_key(folder)}.json"
    path.write_text(entry)
    loaded = load_tokenizer(folder, cache_dir=cache)
    assert fingerprint(loaded) == fingerprint(AutoTokenizer.from_pretrained(folder))
    assert json.loads(path.read_text()) == {"module": type(loaded).__module__, "class": type(loaded).__qualname__}


def test_a_folder_copied_elsewhere_is_its_own_key(tmp_path):
    folder = _save(tmp_path / "a", family_tokenizer("mistral"), "mistral")
    copy = tmp_path / "b"
    shutil.copytree(folder, copy)
    assert _folder_key(folder) != _folder_key(copy)
