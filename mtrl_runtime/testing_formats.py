"""Builders for tests and benchmarks of chat formats: a tiny tokenizer per model family, and what its model writes.

``family_tokenizer(name)`` is ``testing.tiny_tokenizer``'s byte-level BPE
trained with the family's special tokens, its bos/eos set as the family sets
them, and the format's template (written by the project from the family's
public documentation) as its own chat template. ``call_text`` and
``reasoning_text`` write what a model of the family generates, for the
``scripted`` engine to emit. ``family_model(name, tokenizer)`` is a tiny
randomly initialised model in the family's transformers architecture
(Qwen3, Qwen3-MoE, Qwen3.5, Gemma 4, Llama, Mistral, GPT-OSS, DeepSeek V3).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

# per format: (special tokens, bos, eos, pad); the first token is also unk
FAMILY_TOKENS: dict[str, tuple[list[str], str, str]] = {
    "hermes": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_start|>", "<|im_end|>"),
    "qwen3_coder": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_start|>", "<|im_end|>"),
    "qwen3_5": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_start|>", "<|im_end|>"),
    "gemma4": (
        ["<pad>", "<bos>", "<eos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
         "<|tool_response>", "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|think|>"],
        "<bos>", "<eos>",
    ),
    "llama3_json": (
        ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"],
        "<|begin_of_text|>", "<|eot_id|>",
    ),
    "mistral": (
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[THINK]", "[/THINK]", "[ARGS]"],
        "<s>", "</s>",
    ),
    "harmony": (
        ["<|endoftext|>", "<|startoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
         "<|return|>", "<|call|>"],
        "<|startoftext|>", "<|return|>",
    ),
    "deepseek_v3": (
        ["<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
         "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
         "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"],
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
    ),
}


def family_tokenizer(name: str, vocab_size: int = 512, template: str | None = None) -> Any:
    """A tiny tokenizer of format ``name``'s family, with that format's template (or ``template``) as its chat template.

    ``template`` is for a family's published template text (the tests keep the real ones in ``tests/data``).
    """
    from transformers import PreTrainedTokenizerFast

    from .chat.formats import CHAT_FORMATS, QWEN3_TEMPLATE
    from .testing import trained_bpe

    fmt = CHAT_FORMATS.get(name)
    specials, bos, eos = FAMILY_TOKENS[name]
    tok = trained_bpe(vocab_size, specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=specials[0], unk_token=specials[0]
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in specials if t not in (bos, eos, specials[0])]})
    tokenizer.chat_template = template if template is not None else QWEN3_TEMPLATE if name == "hermes" else fmt.template
    return tokenizer


# per format: the transformers architecture of the family's models (DeepSeek V3's own: MLA attention, routed experts)
FAMILY_ARCHITECTURES: dict[str, str] = {
    "hermes": "qwen3",
    "qwen3_coder": "qwen3_moe",  # Qwen3-Coder-30B-A3B / 480B-A35B are Qwen3-MoE models
    "qwen3_5": "qwen3_5_text",  # Qwen3.5 / 3.6: Gated DeltaNet layers interleaved with full attention
    "gemma4": "gemma4_text",  # Gemma 4: sliding and global attention, per-layer input embeddings
    "llama3_json": "llama",
    "mistral": "mistral",
    "harmony": "gpt_oss",
    "deepseek_v3": "deepseek_v3",
}


def family_model(name: str, tokenizer: Any, hidden_size: int = 64, layers: int = 2, seed: int = 0) -> Any:
    """A tiny randomly initialised model in format ``name``'s family architecture, sized to ``tokenizer``.

    Hidden ``hidden_size``, ``layers`` layers, 4 attention heads; the mixture
    of experts families get 4 experts, 2 per token (DeepSeek V3: its first
    layer dense, as the family's first layers are).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = FAMILY_ARCHITECTURES[name]
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    head = hidden_size // 4
    extra: dict[str, dict[str, Any]] = {
        "qwen3": dict(head_dim=head),
        "qwen3_moe": dict(head_dim=head, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size,
                          decoder_sparse_step=1),
        "qwen3_5_text": dict(head_dim=head, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=head,
                             linear_value_head_dim=head, linear_conv_kernel_dim=4,
                             layer_types=["linear_attention"] * (layers - 1) + ["full_attention"]),
        "gemma4_text": dict(head_dim=head, global_head_dim=head, vocab_size_per_layer_input=len(tokenizer),
                            hidden_size_per_layer_input=16, sliding_window=16,
                            layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"]),
        "llama": {},
        "mistral": dict(head_dim=head, sliding_window=None),
        "gpt_oss": dict(head_dim=head, num_local_experts=4, num_experts_per_tok=2, sliding_window=16),
        "deepseek_v3": dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                            moe_intermediate_size=hidden_size, first_k_dense_replace=1, kv_lora_rank=16,
                            q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8),
    }
    torch.manual_seed(seed)
    config = AutoConfig.for_model(arch, **{**common, **extra[arch]})
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    return model


def call_text(name: str, calls: list[tuple[str, Mapping[str, Any]]], content: str = "") -> str:
    """What a model of format ``name``'s family writes to make ``calls`` (name, arguments), after ``content``."""
    dumps = lambda value: json.dumps(value, ensure_ascii=False)  # noqa: E731
    if name == "hermes":
        return content + "".join(
            ("\n" if content or i else "") + f'<tool_call>\n{{"name": {dumps(n)}, "arguments": {dumps(a)}}}\n</tool_call>'
            for i, (n, a) in enumerate(calls)
        )
    if name == "gemma4":
        # the model ends a call with <|tool_response>, where the tool's result goes, and an answer with <turn|>
        return content + "".join(f"<|tool_call>call:{n}{_gemma_value(a)}<tool_call|>" for n, a in calls) + "<|tool_response>"
    if name in ("qwen3_coder", "qwen3_5"):
        # Qwen3.5 replies after the prompt's "<think>\n": a call without reasoning closes an empty block first
        head = "\n</think>\n\n" if name == "qwen3_5" else ""
        blocks = []
        for n, a in calls:
            params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else dumps(v)}\n</parameter>\n" for k, v in a.items())
            blocks.append(f"<tool_call>\n<function={n}>\n{params}</function>\n</tool_call>")
        return head + content + (("\n\n" if head else "\n") if content else "") + "\n".join(blocks)
    if name == "llama3_json":
        return "<|python_tag|>" + "; ".join(f'{{"name": {dumps(n)}, "parameters": {dumps(a)}}}' for n, a in calls)
    if name == "mistral":
        return content + "[TOOL_CALLS]" + dumps([{"name": n, "arguments": a} for n, a in calls])
    if name == "harmony":
        preamble = f"<|channel|>commentary<|message|>{content}<|end|><|start|>assistant" if content else ""
        return preamble + "<|end|><|start|>assistant".join(
            f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{dumps(a)}" for n, a in calls
        ) + "<|call|>"
    if name == "deepseek_v3":
        inner = "".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{dumps(a)}\n```<｜tool▁call▁end｜>" for n, a in calls
        )
        return content + "<｜tool▁calls▁begin｜>" + inner + "<｜tool▁calls▁end｜>"
    raise KeyError(f"unknown chat format {name!r}; known: {', '.join(sorted(FAMILY_TOKENS))}")


def answer_text(name: str, content: str, reasoning: str | None = None) -> str:
    """What a model of format ``name``'s family writes to answer ``content`` after ``reasoning``."""
    if name == "harmony":
        thought = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning else ""
        return f"{thought}<|channel|>final<|message|>{content}"
    if name == "qwen3_5":  # the prompt opened <think>: the reply closes it, empty or not
        return f"{reasoning or ''}\n</think>\n\n{content}"
    if name == "gemma4":
        return (f"<|channel>thought\n{reasoning}<channel|>" if reasoning else "") + content + "<turn|>"
    if reasoning is None or name == "llama3_json":
        return content
    if name == "mistral":
        return f"[THINK]{reasoning}[/THINK]{content}"
    return f"<think>\n{reasoning}\n</think>\n\n{content}"


def _gemma_value(value: Any) -> str:
    """``value`` in Gemma 4's call notation: bare keys, strings between ``<|"|>`` tokens, JSON literals otherwise."""
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_gemma_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_gemma_value(v) for v in value) + "]"
    return json.dumps(value)


__all__ = ["FAMILY_ARCHITECTURES", "FAMILY_TOKENS", "answer_text", "call_text", "family_model", "family_tokenizer"]
