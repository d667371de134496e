"""``torchrun --nproc-per-node 2 -m mtrl_runtime.cli train``: the launch users run, on CPU (gloo).

Rank 0 runs the hf engine, the coordinator, the store and the agent's
rollouts; both ranks train their FSDP2 shard of a tiny Llama. Two steps;
the run's store must hold both steps' updates made at world size 2, the
final adapter must load, and the checkpoint must be there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _groups import processes
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.store import open_store
from mtrl_runtime.training import build_policy, join_torchrun

pytestmark = processes  # its torchrun jobs never run beside another job or a Ray cluster
AGENT = Path(__file__).resolve().parent / "_fsdp_agent.py"


def config(tmp_path: Path, model_dir: Path) -> dict:
    return {"core": {"engine": "hf", "model": str(model_dir), "run_dir": str(tmp_path / "run"), "group_size": 2,
                     "train_batch_size": 2, "max_steps": 2, "max_turns": 1, "lora_rank": 4, "lora_alpha": 8,
                     "learning_rate": 1e-3, "val_every": 0, "sampling_params": {"max_tokens": 6}},
            "advanced": {"rollout_timeout_s": 120, "checkpoint_every": 1, "precision": "fp32"}}


def test_torchrun_trains_a_run_over_two_ranks(tmp_path, tiny_model_dir):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config(tmp_path, tiny_model_dir)))
    rows = [{"id": f"t{i}", "prompt": f"What is the value under A{i}?"} for i in range(4)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           "-m", "mtrl_runtime.cli", "train", str(tmp_path / "cfg.yaml"), "--agent", f"{AGENT}:agent",
           "--dataset", str(tmp_path / "tasks.jsonl"), "--no-mlflow"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    assert "trained steps 1..2" in done.stdout, done.stdout[-3000:]

    store = open_store(tmp_path / "run" / "trajectories.db")
    try:
        assert [(s, v) for s, _, v in store.metric_history("train/world_size")] == [(0, 2.0), (1, 2.0)]
        assert [v for _, _, v in store.metric_history("train/policy_version")] == [1.0, 2.0]
        assert all(v > 0 for _, _, v in store.metric_history("train/tokens_trained"))
    finally:
        store.close()
    adapter = tmp_path / "run" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    policy = build_policy(tiny_model_dir, rank=4, alpha=8, device="cpu")
    policy.load_weights(adapter)  # the gathered adapter fits the model
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "policy" / "trainer_state.pt").is_file()

    # resumed under torchrun: rank 0 reads the checkpoint, each rank loads its shard, the run goes on
    done = subprocess.run(cmd + ["--resume", "--max-steps", "3"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    assert "trained steps 3..3" in done.stdout, done.stdout[-3000:]
    store = open_store(tmp_path / "run" / "trajectories.db")
    try:
        assert [(s, v) for s, _, v in store.metric_history("train/world_size")] == [(0, 2.0), (1, 2.0), (2, 2.0)]
        assert [v for _, _, v in store.metric_history("train/policy_version")] == [1.0, 2.0, 3.0]
    finally:
        store.close()


def test_a_world_size_that_does_not_divide_the_batch_fails_before_joining():
    cfg = MtrlConfig.coerce({"core": {"group_size": 3, "train_batch_size": 2}})
    with pytest.raises(ValueError, match="world size 4 does not divide the batch of 6 rollouts per step"):
        join_torchrun(cfg, {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0"})
    assert join_torchrun(cfg, {}) is None  # one process: nothing to join
