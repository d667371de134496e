"""The trainable policy: a causal LM wrapped with LoRA (peft) or fully trainable.

With LoRA the reference policy for a KL term is the same model with its
adapters disabled, so no second copy is kept; full fine-tuning keeps a frozen
copy only when asked (``keep_reference``). Under LoRA a model loaded from a
folder keeps its frozen base in the dtype ``_precision.frozen_base_dtype``
picks (bf16 for a bf16 model trained under bf16 autocast); the LoRA weights,
and so their gradients and optimizer state, are fp32.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from ._precision import frozen_base_dtype, resolve_autocast

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Policy:
    """A causal LM ready to train, and how to reach its reference policy."""

    model: Any
    tokenizer: Any | None = None
    lora: bool = True
    target_modules: tuple[str, ...] = ()
    reference_model: Any | None = field(default=None, repr=False)  # full fine-tuning only

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_token_id(self) -> int:
        for source in (self.tokenizer, getattr(self.model, "config", None)):
            pad = getattr(source, "pad_token_id", None)
            if pad is not None:
                return int(pad)
        return 0

    @property
    def supports_logits_to_keep(self) -> bool:
        """Whether the model's forward can project only selected positions to the vocabulary."""
        base = self.model.get_base_model() if self.lora else self.model
        return "logits_to_keep" in inspect.signature(base.forward).parameters

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """The reference policy to call inside the block: the base model (adapters off) or the frozen copy."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
        elif self.reference_model is not None:
            yield self.reference_model
        else:
            raise ValueError(
                "a KL term with full fine-tuning needs a frozen reference copy: "
                "build the policy with keep_reference=True"
            )

    def save_weights(self, folder: str | Path) -> Path:
        """Write the adapter (LoRA) or the whole model into ``folder``, atomically."""
        with atomic_folder(folder) as tmp:
            self.model.save_pretrained(tmp)
            if self.tokenizer is not None and not self.lora:
                self.tokenizer.save_pretrained(tmp)
        return Path(folder)

    def load_weights(self, folder: str | Path) -> None:
        """Load weights written by ``save_weights`` into this policy."""
        from safetensors.torch import load_file

        folder = Path(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors weights in {folder}")
        state: dict[str, torch.Tensor] = {}
        for path in files:
            state.update(load_file(str(path), device=str(self.device)))
        if self.lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(f"{folder}: adapter weights do not fit this model: {unexpected[:5]}")
        else:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected:
                raise ValueError(f"{folder}: weights do not fit this model: {unexpected[:5]}")


def build_policy(
    model: str | Path | Any,
    tokenizer: Any | None = None,
    *,
    lora: bool = True,
    rank: int = 32,
    alpha: int = 64,
    dropout: float = 0.0,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    keep_reference: bool = False,
    device: str = "auto",
    base_dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Policy:
    """Load (from a local folder) or take a causal LM and make it trainable.

    With ``lora`` only LoRA adapters on ``target_modules`` that exist in the
    model train (names not present are skipped; none present is an error);
    otherwise every parameter trains. The model is left in eval() mode. A
    model loaded from a folder goes to ``device`` (``auto``: CUDA when there
    is one); a model object stays where it is (e.g. shared with the hf engine).
    ``base_dtype``: the dtype a folder's weights are loaded in under LoRA
    (full fine-tuning keeps fp32 master weights). ``seed`` draws the adapters'
    random initial weights from a generator of their own, so the same config
    starts from the same adapter whatever ran before in the process (the
    process's random state is left as it was).
    """
    if isinstance(model, (str, Path)):
        model, tokenizer = _load_folder(Path(model), tokenizer, base_dtype if lora else torch.float32)
        model = model.to(train_device(device))
    if lora:
        from peft import LoraConfig, get_peft_model

        present = _existing_targets(model, target_modules)
        config = LoraConfig(
            r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(present),
            bias="none", task_type="CAUSAL_LM",
        )
        with _seeded(seed, _device_of(model)):
            model = get_peft_model(model, config)
        for param in model.parameters():  # LoRA weights, their gradients and AdamW state in fp32 over any base
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
        policy = Policy(model=model, tokenizer=tokenizer, lora=True, target_modules=present)
    else:
        for param in model.parameters():
            param.requires_grad_(True)
        reference = _frozen_copy(model) if keep_reference else None
        policy = Policy(model=model, tokenizer=tokenizer, lora=False, reference_model=reference)
    policy.model.eval()
    return policy


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Torch's random state set to ``seed`` inside, restored after (CPU, and ``device`` when it is CUDA)."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _device_of(model: Any) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def policy_from_config(config: Any, model: str | Path | Any, tokenizer: Any | None = None) -> Policy:
    """``build_policy`` with the LoRA settings of an ``MtrlConfig``; ``model`` is a folder or a model."""
    return build_policy(model, tokenizer, **policy_settings(config, model))


def policy_settings(config: Any, model: str | Path | Any) -> dict[str, Any]:
    """``build_policy``'s keyword arguments from an ``MtrlConfig`` (``model``: a folder or a model)."""
    core, advanced = config.core, config.advanced
    base_dtype = torch.float32
    if isinstance(model, (str, Path)) and not advanced.full_finetune:
        compute = resolve_autocast(advanced.precision, train_device(advanced.train_device))
        base_dtype = frozen_base_dtype(advanced.frozen_base_dtype, folder_dtype(Path(model)), compute)
    return dict(
        lora=not advanced.full_finetune,
        rank=core.lora_rank,
        alpha=core.lora_alpha,
        dropout=advanced.lora_dropout,
        target_modules=advanced.lora_target_modules,
        keep_reference=advanced.full_finetune and (advanced.kl_coef > 0 or advanced.measure_kl_ref),
        device=advanced.train_device,
        base_dtype=base_dtype,
        seed=core.seed,
    )


def folder_dtype(folder: Path) -> torch.dtype:
    """The dtype a model folder's config declares (``dtype``, or the older ``torch_dtype``); fp32 when none."""
    path = folder / "config.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    declared = data.get("dtype") or data.get("torch_dtype")
    value = getattr(torch, declared, None) if isinstance(declared, str) else None
    return value if isinstance(value, torch.dtype) else torch.float32


def train_device(device: str = "auto") -> torch.device:
    """``auto``: the first CUDA device when torch sees one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"advanced.train_device: {device!r} asked for, but torch sees no CUDA device")
    return torch.device(device)


@contextlib.contextmanager
def atomic_folder(folder: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces ``folder`` by renames.

    A reader sees either the old complete folder or the new one: the old one
    is moved aside before the new one is renamed into place, and removed after.
    The files are fsynced before the rename and the parent after it, so the
    folder is complete after a power loss too, not only after a killed process.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        yield tmp
        fsync_tree(tmp)
        old = None
        if folder.exists():
            old = folder.parent / f".{folder.name}.old-{os.getpid()}"
            os.replace(folder, old)
        os.replace(tmp, folder)
        _fsync_path(folder.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then each folder (its entries), deepest first."""
    folders = [root]
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            folders.append(path)
        elif path.is_file():
            _fsync_path(path)
    for path in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        _fsync_path(path)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_folder(folder: Path, tokenizer: Any | None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any | None]:
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model {str(folder)!r} is not a local folder; resolve model names "
            "(e.g. smollm2-135m) to a folder first"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # fp32 master weights, or (LoRA) the frozen base in the dtype the step computes in; bf16 through autocast
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    if tokenizer is None and any(folder.glob("tokenizer*")):
        tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _existing_targets(model: Any, wanted: Sequence[str]) -> tuple[str, ...]:
    """The names in ``wanted`` that name linear layers of ``model``."""
    linear_types: tuple[type, ...] = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        linear_types += (Conv1D,)
    except ImportError:  # pragma: no cover - older transformers
        pass
    names = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, linear_types)}
    present = tuple(name for name in wanted if name in names)
    if not present:
        raise ValueError(
            f"lora_target_modules {list(wanted)}: none is a linear layer of this model; "
            f"its linear layers are {sorted(names)}"
        )
    return present


def _frozen_copy(model: Any) -> Any:
    reference = copy.deepcopy(model)
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference.eval()


__all__ = [
    "DEFAULT_TARGET_MODULES",
    "Policy",
    "atomic_folder",
    "build_policy",
    "folder_dtype",
    "policy_from_config",
    "policy_settings",
]
