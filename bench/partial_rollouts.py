"""Partial rollouts against whole-turn rollouts: the same asynchronous run, long and short episodes mixed.

The task: a plain OpenAI-client agent (``@rollout``) whose episodes take 1
to 12 turns (the task says how many; each turn's reply is followed by a
user message asking for more), the tiny model (hidden 64, 2 layers, the
byte-level BPE tokenizer trained here) served by the in-process ``hf``
engine, full fine-tuning, one version behind (``max_steps_off_policy`` 1).
Reward: the share of digits in the replies (the model can learn it in a
few steps). Both arms run the same seeds and the same stale-token
correction (``truncated_is``); the only difference is
``advanced.async_config.partial_rollouts``:

- on: an update lands between two decode steps; turns in flight go on under
  the new weights, each token keeping its version;
- off: the update waits until the engine's turns in flight have ended,
  admitting no new turn meanwhile.

Per arm (step 0 excluded from the timings: nothing overlaps it): seconds per
step; trainer idle time per step (waiting for its batch,
``time/rollout_wait``, plus waiting for the engine to drain,
``time/update_wait``); the staleness histogram of trained tokens (versions
behind the trained policy); the turns that spanned two versions; the reward
per step (the same learning: first and last steps' means side by side).
The arms alternate (on, off, on, off, ...) so the machine's load falls on
both alike.

    python bench/partial_rollouts.py [--steps 8] [--repeats 2] [--max-tokens 16] [--lr 1e-2]
        [--out bench/results/partial_rollouts.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from _machine import load_note, machine_info, model_dtype  # noqa: E402

TURNS = (1, 12, 2, 10, 3, 8, 1, 12, 5, 6, 2, 11)  # turns per task: short and long episodes mixed
DIGITS = set("0123456789")


def tasks() -> list[dict[str, Any]]:
    return [{"id": f"t{i:02d}-{n}turns", "prompt": f"Count to {n}, one number per reply.", "data": {"turns": n}}
            for i, n in enumerate(TURNS)]


def build_agent() -> Any:
    import openai

    from mtrl_adapters import aupdate_reward, rollout

    clients: dict[int, Any] = {}

    def client() -> Any:
        loop = id(asyncio.get_running_loop())
        if loop not in clients:
            clients[loop] = openai.AsyncOpenAI(base_url="http://unused.invalid/v1", api_key="unused", max_retries=0)
        return clients[loop]

    @rollout
    async def agent(task: Any) -> None:
        messages = [{"role": "user", "content": task.prompt}]
        replies = []
        for turn in range(task.data["turns"]):
            reply = await client().chat.completions.create(model="policy", messages=messages)
            text = reply.choices[0].message.content or ""
            replies.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next ({turn + 2})"}]
        chars = "".join(replies)
        await aupdate_reward(sum(c in DIGITS for c in chars) / max(len(chars), 1))

    return agent


def run_arm(partial: bool, steps: int, seed: int, max_tokens: int, lr: float) -> dict[str, Any]:
    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.engines import HFEngine
    from mtrl_runtime.store import SQLiteStore
    from mtrl_runtime.testing import tiny_model, tiny_tokenizer
    from mtrl_runtime.training import MultiTurnRLTrainer

    tok = tiny_tokenizer()
    model = tiny_model(tok, hidden_size=64, layers=2, seed=seed)
    engine = HFEngine.from_objects(model, tok, eos_token_ids=())  # every turn max_tokens long: equal work per arm
    with tempfile.TemporaryDirectory() as tmp:
        config = MtrlConfig.from_dict({
            "core": {"run_dir": str(Path(tmp) / "run"), "group_size": 4, "train_batch_size": 2, "max_steps": steps,
                     "learning_rate": lr, "max_turns": 12, "seed": seed, "loss_fn": "ppo",
                     "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0}},
            "advanced": {"full_finetune": True, "checkpoint_every": 0, "max_concurrency": 16,
                         "rollout_timeout_s": 900,
                         "async_config": {"enabled": True, "max_steps_off_policy": 1, "partial_rollouts": partial,
                                          "stale_correction": "truncated_is"}},
        })
        started = time.perf_counter()
        result = MultiTurnRLTrainer(agent_env=build_agent(), training_dataset=tasks(), config=config, engine=engine,
                                    tracking=False).train(progress=False)
        wall = time.perf_counter() - started
        store = SQLiteStore(Path(tmp) / "run" / "trajectories.db")
        try:
            turns = [t for r in store.rollouts() if r.step is not None for t in r.turns]
        finally:
            store.close()
    reports = result.reports
    later = reports[1:]
    lags: Counter[int] = Counter()
    for r in reports:
        trained = r.metrics.get("train/tokens_trained", 0.0)
        behind = 0.0
        for key, value in r.metrics.items():
            if key.startswith("async/token_lag/"):
                lags[int(key.rsplit("/", 1)[1])] += int(value)
                behind += value
        lags[0] += int(max(trained - behind, 0.0))
    idle = [r.metrics["time/rollout_wait"] + r.metrics.get("time/update_wait", 0.0) for r in later]
    rewards = [r.metrics["rollout/reward/mean"] for r in reports]
    return {
        "partial_rollouts": partial,
        "steps": steps,
        "wall_s": wall,
        "seconds_per_step_mean": statistics.fmean(r.metrics["time/step"] for r in later),
        "trainer_idle_s_per_step": statistics.fmean(idle),
        "rollout_wait_s_per_step": statistics.fmean(r.metrics["time/rollout_wait"] for r in later),
        "update_wait_s_per_step": statistics.fmean(r.metrics.get("time/update_wait", 0.0) for r in later),
        "update_s_per_step": statistics.fmean(r.metrics["time/update"] for r in later),
        "token_staleness_histogram": {str(k): lags[k] for k in sorted(lags)},
        "turns": len(turns),
        "turns_spanning_versions": sum(t.token_versions is not None for t in turns),
        "stale_token_fraction_mean": statistics.fmean(r.metrics.get("train/stale_token_fraction", 0.0) for r in reports),
        "reward_per_step": rewards,
        "reward_first_half_mean": statistics.fmean(rewards[: len(rewards) // 2]),
        "reward_second_half_mean": statistics.fmean(rewards[len(rewards) // 2:]),
        "dtype": model_dtype(model),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "partial_rollouts.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load_before = os.getloadavg()
    rows = []
    for repeat, partial in itertools.product(range(args.repeats), (True, False)):
        row = run_arm(partial, args.steps, args.seed + repeat, args.max_tokens, args.lr)
        row["repeat"] = repeat
        rows.append(row)
        print(f"repeat {repeat} partial={partial!s:5} {row['seconds_per_step_mean']:.2f} s/step, idle "
              f"{row['trainer_idle_s_per_step']:.2f} s/step, spanning turns {row['turns_spanning_versions']}, "
              f"staleness {row['token_staleness_histogram']}, reward {row['reward_first_half_mean']:.3f} -> "
              f"{row['reward_second_half_mean']:.3f}", flush=True)
    load_after = os.getloadavg()

    def mean(partial: bool, key: str) -> float:
        return statistics.fmean(r[key] for r in rows if r["partial_rollouts"] is partial)

    ratios = {
        "seconds_per_step_off_over_on": mean(False, "seconds_per_step_mean") / mean(True, "seconds_per_step_mean"),
        "trainer_idle_off_over_on": mean(False, "trainer_idle_s_per_step") / max(mean(True, "trainer_idle_s_per_step"), 1e-9),
        "reward_second_half_on_minus_off": mean(True, "reward_second_half_mean") - mean(False, "reward_second_half_mean"),
    }
    out = {
        "benchmark": "partial_rollouts",
        "command": "python bench/partial_rollouts.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(load_before, load_after, threads=1, dtype=rows[0]["dtype"]),
        "load": load_note(load_before, load_after, "seconds are noisy; the arms alternate, so compare the ratios"),
        "task": (f"plain OpenAI-client agent, episodes of {min(TURNS)}-{max(TURNS)} turns ({list(TURNS)}), "
                 f"{args.max_tokens} tokens a turn, learning rate {args.lr:g}, tiny model (hidden 64, 2 layers), hf engine, full fine-tuning, "
                 "2 prompts x 4 rollouts a step, max_steps_off_policy 1, stale_correction truncated_is"),
        "results": rows,
        "ratios": ratios,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
