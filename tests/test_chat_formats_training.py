"""One real training step per chat format, on a tiny model of the family's own architecture.

For each format: the endpoint serves a two-turn rollout (a tool call, the
tool's result, an answer with reasoning) written in the family's syntax by
the scripted engine, rendering with the family's template and parsing with
its format, exactly as in deployment; the recorded turns become samples
(``build_samples``); the behaviour logprobs are the tiny model's own (what
the hf engine records, so the step is on-policy); one LoRA step runs on a
Qwen3 / Qwen3-MoE / Qwen3.5 / Gemma 4 / Llama / Mistral / GPT-OSS / DeepSeek-V3 model built from
config. The loss is finite, the LoRA weights move, and the trained tokens
are the ones the model wrote in its format.
"""

from __future__ import annotations

import json

import openai
import pytest
import torch

from _adapter_support import TOOLS, lookup, specs, tasks
from mtrl_runtime.algorithms.samples import build_samples
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import FAMILY_ARCHITECTURES, FAMILY_TOKENS, answer_text, call_text, family_model, family_tokenizer
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy
from mtrl_runtime.types import Sample

FORMATS = sorted(FAMILY_TOKENS)
ARCHITECTURES = {
    "hermes": "Qwen3ForCausalLM", "qwen3_coder": "Qwen3MoeForCausalLM", "llama3_json": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM", "harmony": "GptOssForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
    "qwen3_5": "Qwen3_5ForCausalLM", "gemma4": "Gemma4ForCausalLM",
}
# what the model writes to call lookup, as each family's syntax puts it (the trained tokens must hold it)
CALL_MARKERS = {
    "hermes": "<tool_call>", "qwen3_coder": "<function=lookup>", "llama3_json": "<|python_tag|>",
    "mistral": "[TOOL_CALLS]", "harmony": "to=functions.lookup", "deepseek_v3": "<｜tool▁calls▁begin｜>",
    "qwen3_5": "<function=lookup>", "gemma4": "<|tool_call>call:lookup{",
}


def _policy(request, prompt, name):
    if request.turn_index == 0:
        return call_text(name, [("lookup", {"key": "K01"})])
    return answer_text(name, "The value of K01 is 10. DONE", reasoning="the lookup said 10")


def _served_rollout(served, name):
    tok = family_tokenizer(name)
    handle = served(ScriptedEngine(tok, lambda request, prompt: _policy(request, prompt, name)),
                    MtrlConfig.coerce({"advanced": {"chat_format": name}}))
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for _ in range(2):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                             "content": str(lookup(**json.loads(call.function.arguments)))})
    assert message.content == "The value of K01 is 10. DONE"
    return tok, handle.store.get_rollout(spec.rollout_id)


def _on_policy(model, sample: Sample) -> Sample:
    """``sample`` with the model's own logprobs as behaviour logprobs (what the hf engine would have recorded)."""
    ids = list(sample.token_ids_T)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    logp = [0.0] + logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    behaviour = tuple(lp if m else 0.0 for lp, m in zip(logp, sample.loss_mask_T))
    return Sample(**{**sample.__dict__, "behaviour_logprobs_T": behaviour})


def _lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("name", FORMATS)
def test_one_training_step_on_a_rollout_rendered_in_each_format(served, name):
    tok, rollout = _served_rollout(served, name)
    assert [len(t.tool_calls) for t in rollout.turns] == [1, 0]
    assert not any(t.malformed_tool_call for t in rollout.turns)
    samples = build_samples(rollout, [1.0] * len(rollout.turns))
    assert len(samples) == 1  # the call's turn extends into the answer's (gpt-oss: after its <|call|>, no glue)
    trained_text = "".join(
        tok.decode([i for i, m in zip(s.token_ids_T, s.loss_mask_T) if m], skip_special_tokens=False) for s in samples
    )
    assert CALL_MARKERS[name] in trained_text  # the call as the model wrote it is what is trained
    assert sum(sum(s.loss_mask_T) for s in samples) == sum(len(t.completion_ids) for t in rollout.turns)

    model = family_model(name, tok)
    assert type(model).__name__ == ARCHITECTURES[name] and model.config.model_type == FAMILY_ARCHITECTURES[name]
    policy = build_policy(model, tok, rank=4, alpha=8)
    samples = [_on_policy(policy.model, s) for s in samples]
    before = _lora_weights(policy.model)
    assert before, f"no LoRA layer on {type(model).__name__}"
    metrics = PolicyUpdate(policy, UpdateSettings(learning_rate=1e-2, precision="fp32")).step(samples)
    after = _lora_weights(policy.model)
    assert torch.isfinite(torch.tensor(metrics["train/loss"])), metrics
    assert metrics["train/tokens_trained"] == sum(sum(s.loss_mask_T) for s in samples)
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    assert moved and all(torch.isfinite(after[n]).all() for n in after), "the step must change the LoRA weights"
