"""Roles on the vllm engine: each role's adapter is loaded by its own name and a role's request names it.

vLLM is an extra CI lacks, so the server here is a stand-in on 127.0.0.1 that answers the routes the engine uses
(``/v1/models``, ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``/v1/completions``) and records what
each request named; the engine, its HTTP client and its adapter bookkeeping are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from mtrl_runtime.engines.vllm import VLLMEngine
from mtrl_runtime.types import GenerationRequest, LoadsRoleAdapters, SamplingParams, ServesRoles


class _VLLMStandIn(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._json({"data": [{"id": "base", "max_model_len": 4096}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.calls.append((self.path, body))  # type: ignore[attr-defined]
        if self.path == "/v1/completions":
            return self._json({"choices": [{"token_ids": [5, 6, 2], "finish_reason": "stop",
                                            "logprobs": {"token_logprobs": [-0.1, -0.2, -0.3]}}]})
        self._json("ok")

    def _json(self, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def stand_in() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VLLMStandIn)
    server.calls = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


def _adapters(root: Path, version: int) -> dict[str, str]:
    out = {}
    for role in ("planner", "worker"):
        folder = root / f"v{version}" / role
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        out[role] = str(folder)
    return out


def test_each_role_is_loaded_and_served_by_its_own_name(stand_in, tiny_tok, tmp_path):
    async def run() -> None:
        engine = VLLMEngine(url=stand_in.url, tokenizer=tiny_tok, keep_versions=1)
        try:
            assert isinstance(engine, ServesRoles) and isinstance(engine, LoadsRoleAdapters)
            await engine.load_role_adapters(_adapters(tmp_path, 1), 1)
            assert engine.serves_roles() == frozenset({"planner", "worker"})
            for role in ("planner", "worker", "planner"):
                await engine.generate(GenerationRequest((1, 2, 3), SamplingParams(max_tokens=4), adapter=1, role=role))
            await engine.load_role_adapters(_adapters(tmp_path, 2), 2)  # keep_versions=1: version 1's two go
            generation = await engine.generate(GenerationRequest((1, 2), SamplingParams(max_tokens=4), role="worker"))
            assert generation.policy_version == 2
            with pytest.raises(ValueError, match=r"role: 'critic' has no adapter loaded.*'planner', 'worker'"):
                await engine.generate(GenerationRequest((1,), SamplingParams(max_tokens=4), role="critic"))
            with pytest.raises(FileNotFoundError, match=r"paths\['planner'\]"):
                await engine.load_role_adapters({"planner": str(tmp_path)}, 3)
        finally:
            await engine.close()

    asyncio.run(run())
    calls = stand_in.calls
    loads = [body["lora_name"] for path, body in calls if path == "/v1/load_lora_adapter"]
    served = [body["model"] for path, body in calls if path == "/v1/completions"]
    unloads = sorted(body["lora_name"] for path, body in calls if path == "/v1/unload_lora_adapter")
    assert loads == ["planner-v1", "worker-v1", "planner-v2", "worker-v2"]
    assert served == ["planner-v1", "worker-v1", "planner-v1", "worker-v2"]
    assert unloads == ["planner-v1", "worker-v1"]


def test_an_update_pushes_every_roles_adapter_by_name(stand_in, tmp_path):
    """PushedWeights with RoleUpdates: after a real step on the tiny model each role's adapter folder is written
    and loaded on the server by its role's name."""
    from mtrl_runtime.testing import tiny_model, tiny_tokenizer
    from mtrl_runtime.training import PushedWeights, RoleUpdates, UpdateSettings, build_policy
    from mtrl_runtime.types import Sample

    tok = tiny_tokenizer()
    updates = RoleUpdates(build_policy(tiny_model(tok), tok, rank=4, alpha=8, device="cpu"), ("planner", "worker"),
                          UpdateSettings(learning_rate=1e-2))
    samples = [Sample(rollout_id=f"r{i}", group_id="g", segment=0, token_ids_T=(1, 5, 6, 7), loss_mask_T=(0, 1, 1, 1),
                      behaviour_logprobs_T=(0.0, -2.0, -2.0, -2.0), advantages_T=(0.0,) + (1.0 - 2 * (i % 2),) * 3,
                      policy_version_T=(-1, 0, 0, 0), role=role) for i, role in enumerate(("planner", "worker"))]

    async def run() -> None:
        engine = VLLMEngine(url=stand_in.url, tokenizer=tok, keep_versions=2)
        weights = PushedWeights(engine, updates, tmp_path / "run")
        try:
            metrics = await weights.apply(samples)
            assert metrics["train/policy_version"] == 1.0 and engine.serves_roles() == {"planner", "worker"}
        finally:
            weights.close()
            await engine.close()

    asyncio.run(run())
    loads = [body for path, body in stand_in.calls if path == "/v1/load_lora_adapter"]
    assert [body["lora_name"] for body in loads] == ["planner-v1", "worker-v1"]
    for body in loads:
        assert (Path(body["lora_path"]) / "adapter_config.json").is_file()
        assert (Path(body["lora_path"]) / "adapter_model.safetensors").is_file()
