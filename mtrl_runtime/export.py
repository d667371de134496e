"""Export a trained policy for serving: a standard peft adapter, or the base model with the LoRA merged in.

A source is a run folder (its final ``adapter/``, else its latest checkpoint
``checkpoints/step-<N>/policy``), one checkpoint folder, or an adapter
folder. Both exports carry the tokenizer with the chat template mtrl
rendered during training, so a server given only the exported folder
renders prompts and tool calls as the trained policy saw them: the template
the run's trajectory store recorded (the endpoint records its chat format
and template there), else the one the chat format renders with (given as
``chat_format``, else detected from the tokenizer): the tokenizer's own
when it renders tools, else the format's template:

- ``export_adapter``: ``adapter_config.json`` + ``adapter_model.safetensors``
  with ``base_model_name_or_path`` set to the resolved base model folder;
  ``peft.PeftModel.from_pretrained(base, folder)`` loads it, and
  ``mtrl serve --model BASE --adapter FOLDER`` or vLLM's ``--lora-modules`` serve it.
- ``export_merged``: ``merge_and_unload`` of base + LoRA, saved as a plain
  safetensors model folder that ``mtrl serve --model FOLDER`` and
  ``vllm serve FOLDER`` load like any other model.

Each export also writes ``mtrl_export.json`` (form, source, base model,
checkpoint step, chat format and vLLM's tool-call parser for it). The output is built in a temporary sibling folder and
renamed into place, so it is complete or absent.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .run_folder import ADAPTER_FOLDER, CHECKPOINTS_FOLDER, RunFolder
from .training import POLICY_FOLDER, WEIGHTS_FOLDER, atomic_folder

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
EXPORT_INFO = "mtrl_export.json"
MERGE_DTYPES = ("auto", "fp32", "bf16", "fp16")


class ExportError(ValueError):
    """An export source, base model or output folder is unusable; the message names it."""


@dataclass(frozen=True)
class TrainedWeights:
    """Where a source's trained weights are: a LoRA adapter folder, or a full model folder."""

    folder: Path
    kind: Literal["lora", "full"]
    step: int | None = None  # the checkpoint's step (steps trained), None for the final adapter


# ---------------------------------------------------------------------------------------- finding


def find_trained_weights(source: str | Path, step: int | None = None, *, field: str = "source") -> TrainedWeights:
    """The trained weights a run folder, checkpoint folder or adapter folder holds.

    ``step`` picks the checkpoint ``checkpoints/step-<step>`` of a run folder
    instead of its final adapter; ``field`` is the name errors give ``source``.
    """
    path = Path(source).expanduser()
    if not path.is_dir():
        raise ExportError(f"{field}: no folder {str(source)!r}")
    if step is not None:
        return _checkpoint_weights(_checkpoint_folder(path, step))
    kind = _weights_kind(path)
    if kind is not None:
        return TrainedWeights(path, kind)
    if (path / WEIGHTS_FOLDER).is_dir() or (path / POLICY_FOLDER).is_dir():
        return _checkpoint_weights(path)
    run = RunFolder(path)
    if run.adapter.is_dir():
        return find_trained_weights(run.adapter, field=field)
    latest = _latest_checkpoint(path)
    if latest is not None:
        return _checkpoint_weights(latest)
    if run.store.is_file():
        raise ExportError(f"{field} {str(source)!r}: the run folder holds no trained weights yet "
                          f"(no {ADAPTER_FOLDER}/ and no {CHECKPOINTS_FOLDER}/step-*/)")
    raise ExportError(f"{field} {str(source)!r}: not a run folder "
                      f"(no {ADAPTER_FOLDER}/ or {CHECKPOINTS_FOLDER}/step-*/), "
                      f"not a checkpoint and not an adapter folder (no {ADAPTER_CONFIG})")


def _weights_kind(folder: Path) -> Literal["lora", "full"] | None:
    if (folder / ADAPTER_CONFIG).is_file():
        return "lora"
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return "full"  # advanced.full_finetune: the whole model was trained and saved
    return None


def _checkpoint_weights(folder: Path) -> TrainedWeights:
    """The weights inside a checkpoint folder ``step-<N>`` or its ``policy`` folder."""
    policy = folder if (folder / WEIGHTS_FOLDER).is_dir() else folder / POLICY_FOLDER
    weights = policy / WEIGHTS_FOLDER
    kind = _weights_kind(weights)
    if kind is None:
        raise ExportError(f"checkpoint {str(folder)!r}: no weights in {str(weights)!r}")
    name = folder.name if folder.name != POLICY_FOLDER else folder.parent.name
    step = int(name.split("-", 1)[1]) if name.startswith("step-") and name[5:].isdigit() else None
    return TrainedWeights(weights, kind, step)


def _steps(run_dir: Path) -> dict[int, Path]:
    found = {}
    for folder in RunFolder(run_dir).checkpoints.glob("step-*"):
        number = folder.name[len("step-"):]
        if number.isdigit() and folder.is_dir():
            found[int(number)] = folder
    return found


def _latest_checkpoint(run_dir: Path) -> Path | None:
    steps = _steps(run_dir)
    return steps[max(steps)] if steps else None


def _checkpoint_folder(run_dir: Path, step: int) -> Path:
    steps = _steps(run_dir)
    if step not in steps:
        known = ", ".join(str(s) for s in sorted(steps)) or "none"
        raise ExportError(f"step: no checkpoint step-{step:06d} under {str(RunFolder(run_dir).checkpoints)!r} "
                          f"(checkpoints there: {known})")
    return steps[step]


# ---------------------------------------------------------------------------------------- base model


def adapter_config(folder: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, checked to be a LoRA adapter with its weights beside it."""
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{str(folder / ADAPTER_CONFIG)!r}: unreadable ({exc})") from None
    if config.get("peft_type") != "LORA":
        raise ExportError(f"{str(folder / ADAPTER_CONFIG)!r}: peft_type={config.get('peft_type')!r}; "
                          "only LoRA adapters are exported")
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise ExportError(f"adapter {str(folder)!r}: no {ADAPTER_WEIGHTS}")
    return config


def resolve_base_model(weights: TrainedWeights, base_model: str | Path | None = None) -> Path:
    """The local base model folder: ``base_model`` if given, else the adapter's ``base_model_name_or_path``."""
    from .engines import ModelNotFoundError, resolve_model

    if base_model is not None:
        field, spec = "base_model", str(base_model)
    elif weights.kind == "lora":
        field, spec = "base_model_name_or_path", adapter_config(weights.folder).get("base_model_name_or_path")
    else:
        return weights.folder  # a full model is its own base
    if not spec:
        raise ExportError(f"{field}: the adapter {str(weights.folder)!r} names no base model; pass base_model "
                          "(--base-model)")
    try:
        return resolve_model(spec).resolve()
    except (ModelNotFoundError, ValueError) as exc:
        raise ExportError(f"{field}={spec!r}: {exc}; pass the base model folder (--base-model)") from None


# ---------------------------------------------------------------------------------------- writing


def export_adapter(source: str | Path, out_dir: str | Path, *, base_model: str | Path | None = None,
                   step: int | None = None, overwrite: bool = False, chat_format: str | None = None) -> Path:
    """Write ``source``'s LoRA adapter as a standard peft adapter folder at ``out_dir`` (see the module doc)."""
    weights = find_trained_weights(source, step)
    if weights.kind != "lora":
        raise ExportError(f"source {str(source)!r}: holds full model weights (advanced.full_finetune), not a LoRA "
                          "adapter; export it with merged=True (--merged)")
    config = adapter_config(weights.folder)
    base = resolve_base_model(weights, base_model)
    out = _check_out_dir(out_dir, weights.folder, overwrite)
    with atomic_folder(out) as tmp:
        shutil.copyfile(weights.folder / ADAPTER_WEIGHTS, tmp / ADAPTER_WEIGHTS)
        config["base_model_name_or_path"] = str(base)
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _, fmt = save_tokenizer(base, tmp, trained_template(weights.folder, chat_format))
        _write_info(tmp, "adapter", weights, base, chat_format=fmt.name, vllm_tool_parser=fmt.vllm_tool_parser)
        _make_readable(tmp)
    return out


def export_merged(base_model: str | Path | None, adapter: str | Path, out_dir: str | Path, *,
                  dtype: str = "auto", step: int | None = None, overwrite: bool = False,
                  chat_format: str | None = None) -> Path:
    """Merge ``adapter``'s LoRA into the base model and save a standalone model folder at ``out_dir``.

    ``base_model`` (a folder, alias or cached hub id) defaults to the adapter's
    own; ``dtype`` is the saved weights' type: ``auto`` keeps the base
    model's, or ``fp32``, ``bf16``, ``fp16``.
    """
    if dtype not in MERGE_DTYPES:
        raise ExportError(f"dtype: expected one of {', '.join(MERGE_DTYPES)}, got {dtype!r}")
    weights = find_trained_weights(adapter, step)
    base = resolve_base_model(weights, base_model)
    out = _check_out_dir(out_dir, weights.folder, overwrite)
    tokenizer_source = weights.folder if _has_tokenizer(weights.folder) else base
    if not _has_tokenizer(tokenizer_source):
        raise ExportError(f"base_model: {str(tokenizer_source)!r} has no tokenizer; pass the base model folder "
                          "(--base-model)")
    recorded = trained_template(weights.folder, chat_format)
    torch_dtype = _torch_dtype(dtype, base)
    model = _merged_model(weights, base, torch_dtype)
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)  # safetensors
        _, fmt = save_tokenizer(tokenizer_source, tmp, recorded)
        _write_info(tmp, "merged", weights, base, dtype=str(torch_dtype).removeprefix("torch."), chat_format=fmt.name,
                    vllm_tool_parser=fmt.vllm_tool_parser)
        _make_readable(tmp)
    return out


def _merged_model(weights: TrainedWeights, base: Path, torch_dtype: Any) -> Any:
    """The base model with the adapter merged into its weights (a full model: itself), in ``torch_dtype``."""
    from transformers import AutoModelForCausalLM

    if weights.kind == "full":
        return AutoModelForCausalLM.from_pretrained(weights.folder, dtype=torch_dtype)
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_config(weights.folder)  # a LoRA adapter with its weights beside it, or a clear error
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
    config = LoraConfig.from_pretrained(str(weights.folder))
    config.inference_mode = True
    config.base_model_name_or_path = str(base)
    try:
        model = get_peft_model(model, config)
        result = set_peft_model_state_dict(model, load_file(str(weights.folder / ADAPTER_WEIGHTS)))
    except (ValueError, RuntimeError) as exc:  # target modules missing, or weights of other shapes
        raise ExportError(f"adapter {str(weights.folder)!r} does not fit base model {str(base)!r}: "
                          f"{str(exc).splitlines()[0]}") from None
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ExportError(f"adapter {str(weights.folder)!r} does not fit base model {str(base)!r}: "
                          f"weights it has no place for, e.g. {unexpected[:3]}")
    return model.merge_and_unload()


def _torch_dtype(dtype: str, base: Path) -> Any:
    import torch

    if dtype != "auto":
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    found = getattr(torch, str(name), None)
    return found if isinstance(found, torch.dtype) and found.is_floating_point else torch.float32


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


@dataclass(frozen=True)
class TrainedTemplate:
    """The chat format (name) a policy was trained with and, when the run recorded it, the template text."""

    chat_format: str | None
    template: str | None = None
    where: str = ""  # the store that recorded it ("" when nothing was recorded)


def trained_template(weights_folder: Path, chat_format: str | None = None) -> TrainedTemplate:
    """What the run whose weights these are rendered with, from its trajectory store; else ``chat_format`` alone.

    The store is looked for in the weights' folder and the folders above it
    (a run's ``adapter/`` and ``checkpoints/step-N/policy/weights`` both sit
    under it). A ``chat_format`` other than the recorded one is an error:
    the export would render unlike the training.
    """
    from .chat import CHAT_TEMPLATE_META
    from .store import open_store

    folder = weights_folder.resolve()
    for parent in [folder, *folder.parents][:5]:
        db = RunFolder(parent).store
        if not db.is_file():
            continue
        store = open_store(db)
        try:
            recorded = store.get_meta(CHAT_TEMPLATE_META)
        finally:
            store.close()
        if not isinstance(recorded, dict):
            break  # a run from before formats were recorded: render as the format says
        if chat_format is not None and chat_format != recorded.get("chat_format"):
            raise ExportError(f"chat_format={chat_format!r}: the run at {str(parent)!r} was trained with "
                              f"{recorded.get('chat_format')!r}; leave --chat-format out or name that one")
        return TrainedTemplate(recorded.get("chat_format"), recorded.get("template"), str(db))
    return TrainedTemplate(chat_format)


def save_tokenizer(source: Path, out: Path, trained: TrainedTemplate | None = None) -> tuple[Any, Any]:
    """Save ``source``'s tokenizer into ``out`` with the chat template the policy was trained with.

    Returns the tokenizer and its chat format. The template is the one the
    run recorded, else the one the format (``trained.chat_format``, else
    detected from the tokenizer) renders with, as the endpoint does.
    """
    from transformers import AutoTokenizer

    from .chat import ChatRenderer
    from .chat.formats import resolve_format

    trained = trained or TrainedTemplate(None)
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:
        fmt = resolve_format(tokenizer, trained.chat_format, str(source))
    except (KeyError, ValueError) as exc:
        raise ExportError(f"chat_format: {exc.args[0] if exc.args else exc} (--chat-format)") from None
    if trained.template is not None:
        tokenizer.chat_template = trained.template
    else:
        tokenizer.chat_template = ChatRenderer(tokenizer, fallback=fmt.template, stop_tokens=fmt.stop_tokens).template
    tokenizer.save_pretrained(out)
    return tokenizer, fmt


def _check_out_dir(out_dir: str | Path, source: Path, overwrite: bool) -> Path:
    out = Path(out_dir).expanduser().resolve()
    if out == source.resolve() or out in source.resolve().parents:
        raise ExportError(f"out_dir {str(out_dir)!r}: is (or holds) the source {str(source)!r}; choose another folder")
    if out.exists() and not out.is_dir():
        raise ExportError(f"out_dir {str(out_dir)!r}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"out_dir {str(out_dir)!r}: exists and is not empty; choose another folder or "
                          "pass overwrite=True (--force)")
    return out


def _make_readable(folder: Path) -> None:
    """A model folder's usual permissions (0755, files 0644): the temporary folder and some files start private."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _write_info(folder: Path, form: str, weights: TrainedWeights, base: Path, **extra: Any) -> None:
    info = {"form": form, "source": str(weights.folder.resolve()), "base_model": str(base),
            "step": weights.step, "weights": weights.kind, **extra}
    (folder / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


__all__ = [
    "EXPORT_INFO",
    "MERGE_DTYPES",
    "ExportError",
    "TrainedTemplate",
    "TrainedWeights",
    "adapter_config",
    "export_adapter",
    "export_merged",
    "find_trained_weights",
    "resolve_base_model",
    "save_tokenizer",
    "trained_template",
]
