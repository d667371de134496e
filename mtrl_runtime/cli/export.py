"""``mtrl export SOURCE OUT``: write a trained policy as a peft adapter folder, or ``--merged`` as a model folder.

SOURCE is a run folder, a checkpoint folder or an adapter folder (see
``mtrl_runtime.export``). The command ends by printing how to serve what
it wrote, with ``mtrl serve`` and with vLLM.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._command import Command

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM's --max-lora-rank accepts


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a run folder (its adapter/ or latest checkpoint), a checkpoint or an adapter folder")
    p.add_argument("out", help="the folder to write (new or empty; --force replaces it)")
    p.add_argument("--merged", action="store_true", help="merge the LoRA into the base model: a model folder")
    p.add_argument("--base-model", help="the base model (folder, alias or cached hub id); default: the adapter's own")
    p.add_argument("--step", type=int, help="export the run's checkpoint step-N instead of its final adapter")
    p.add_argument("--dtype", default="auto", help="--merged weights: auto (the base model's), fp32, bf16 or fp16")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--chat-format", help="the chat format the policy was trained with, when the source has no run "
                   "store that recorded it (default: detected from the tokenizer)")


def _export(args: argparse.Namespace) -> int:
    from ..export import EXPORT_INFO, ExportError, export_adapter, export_merged

    try:
        if args.merged:
            out = export_merged(args.base_model, args.source, args.out, dtype=args.dtype, step=args.step,
                                overwrite=args.force, chat_format=args.chat_format)
        else:
            out = export_adapter(args.source, args.out, base_model=args.base_model, step=args.step,
                                 overwrite=args.force, chat_format=args.chat_format)
    except ExportError as exc:
        raise SystemExit(f"mtrl export: {exc}") from None
    info = json.loads((out / EXPORT_INFO).read_text(encoding="utf-8"))
    print(f"mtrl: exported {info['form']} to {out} (from {info['source']})")
    print(_serving_hint(out, info))
    return 0


def _serving_hint(out: Path, info: dict) -> str:
    """The commands that serve the exported folder (vLLM with the tool-call parser of the trained chat format)."""
    parser = info.get("vllm_tool_parser", "hermes")
    if info["form"] == "merged":
        return ("serve it:\n"
                f"  mtrl serve --model {out} --inference\n"
                f"  vllm serve {out} --enable-auto-tool-choice --tool-call-parser {parser}")
    rank = int(json.loads((out / "adapter_config.json").read_text(encoding="utf-8")).get("r", 64))
    base = info["base_model"]
    template = out / "chat_template.jinja"
    template_arg = f" --chat-template {template}" if template.is_file() else ""
    return ("serve it:\n"
            f"  mtrl serve --model {base} --adapter {out} --inference\n"
            f"  vllm serve {base} --enable-lora --max-lora-rank {_vllm_rank(rank)} --lora-modules trained={out}"
            f"{template_arg} --enable-auto-tool-choice --tool-call-parser {parser}")


def _vllm_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


EXPORT = Command("export", "write a trained policy as a peft adapter or a merged model folder",
                 _export_args, _export)
