"""Users' latency under ``mtrl online``: while a training step runs on the learner's thread, against idle.

Side by side in one run: an ``OnlineService`` serves the model (hf engine,
inference mode, as deployed users reach it); four user sessions are
recorded and rewarded, and their samples make one training batch (repeated
``--repeat`` times, so that one step lasts seconds). Then:

1. idle: ``--requests`` chat completions one after another, nothing training;
2. during: the same requests, sent one after another while one
   ``PolicyUpdate.step`` on that batch runs on the learner's thread; only
   requests that started and ended inside the step's window count.

Reported: p50 / p99 of each side, their ratio (during / idle), the step's
length, and the count inside the window. A request that waited on the step
would take about the step's length; the claim is that none does.

    .venv/bin/python bench/online_latency.py [--model smollm2-135m|tiny] [--requests 20] [--repeat 50]

Results: ``results/online_latency.json`` (SmolLM2-135M), ``results/online_latency.tiny.json`` (the tiny model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from _machine import load_note, machine_info, model_dtype

from mtrl_adapters.online import OnlineClient
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.online import OnlineService, OnlineSettings
from mtrl_runtime.rollouts import GroupResult
from mtrl_runtime.testing import latencies_during_step

RESULTS = Path(__file__).resolve().parent / "results" / "online_latency.json"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def model_folder(spec: str, work: Path) -> str:
    if spec != "tiny":
        return spec
    from mtrl_runtime.testing import save_tiny_model

    return str(save_tiny_model(work / "tiny"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, tiny (hidden 64, 2 layers) or a folder")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=50, help="copies of the batch's samples in the one step")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = MtrlConfig.from_dict({
            "core": {"engine": "hf", "model": model_folder(args.model, work), "run_dir": str(work / "run"),
                     "lora_rank": 8, "lora_alpha": 16, "sampling_params": {"max_tokens": args.max_tokens}},
            "advanced": {"server": {"port": 0}, "reward_range": [0.0, 1.0]},
        })
        service = OnlineService.start(config, OnlineSettings(sample_rate=1.0, group_size=2), tick=False)
        try:
            result = measure(service, args)
            dtype = model_dtype(service.learner.update.policy.model)
        finally:
            service.close()
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or (os.cpu_count() or 1)
    load_after = os.getloadavg()
    result.update({"model": args.model, "max_tokens": args.max_tokens, "repeat": args.repeat,
                   "machine": machine_info(load_before, load_after, threads, dtype=dtype),
                   "note": load_note(load_before, load_after, "both sides share that load (they alternate little: "
                                     "idle first, then during; rerun to see the spread)")})
    target = RESULTS if args.model == "smollm2-135m" else RESULTS.with_name(f"online_latency.{Path(args.model).name}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))


def measure(service: OnlineService, args: argparse.Namespace) -> dict[str, Any]:
    http = httpx.Client(base_url=service.url, timeout=600.0)
    client = OnlineClient(service.url)
    ids = []
    for i in range(4):  # two tasks, two users each; the sessions' own rollouts make the batch
        sid = f"bench-{i}"
        opened = client.open_session(sid, {"prompt": f"How do I reset device {i % 2}?"})
        assert opened.sampled and opened.request is not None
        rollout_id = opened.request["metadata"]["rollout_id"]
        token = opened.request["metadata"]["rollout_token"]
        http.post(f"/rollouts/{rollout_id}/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                  json={"model": "policy", "max_tokens": args.max_tokens,
                        "messages": [{"role": "user", "content": f"How do I reset device {i % 2}?"}]})
        http.post(f"/rollouts/{rollout_id}/complete", headers={"authorization": f"Bearer {token}"},
                  json={"status": "completed"})
        ids.append(sid)
    store = service.stack.store
    rollouts = [replace(store.get_rollout(service.book.get(s).rollout_id), reward=float(i < 2))
                for i, s in enumerate(ids)]
    task = store.get_task(rollouts[0].task_id)
    groups = [GroupResult(f"g{i}", task, tuple(rollouts[i::2]), tuple(rollouts[i::2]), False) for i in range(2)]
    batch = service.learner.prepare(groups)
    assert batch.samples, batch.metrics
    long_batch = replace(batch, samples=batch.samples * args.repeat)

    def ask() -> tuple[float, float]:
        start = time.perf_counter()
        r = http.post("/v1/chat/completions", json={"model": "policy", "max_tokens": args.max_tokens,
                                                     "messages": [{"role": "user", "content": "hello there"}]})
        r.raise_for_status()
        return start, time.perf_counter()

    ask()  # warm
    idle = [e - s for s, e in (ask() for _ in range(args.requests))]
    step_s, inside = latencies_during_step(service, long_batch, ask)
    sides = {"idle": idle, "during_step": inside}
    figures = {name: {"n": len(v), "p50_ms": statistics.median(v) * 1e3 if v else None,
                      "p99_ms": quantile(v, 0.99) * 1e3 if v else None} for name, v in sides.items()}
    ratio = {q: figures["during_step"][f"{q}_ms"] / figures["idle"][f"{q}_ms"]
             for q in ("p50", "p99") if inside}
    return {"step_s": step_s, "samples_in_step": len(long_batch.samples), "latency": figures,
            "ratio_during_over_idle": ratio,
            "longest_during_over_step": (max(inside) / step_s) if inside else None}


if __name__ == "__main__":
    main()
