"""Tasks, agent and config of the dynamic-sampling tests; run as a script, a training run that kills itself.

Half the tasks are *flat*: every rollout of them reports the same reward, so
their groups carry no signal. The others are *live*: a rollout's reward is 32
random bits of its id, so the rollouts of a group never tie. Whether a group is
useful is therefore a property of its task alone, whatever order rollouts
finish in and whichever process ran them.

    python tests/_refill_task.py RUN_DIR MODEL_DIR KILL_GROUP

trains (scripted engine, the tiny model's LoRA pushed to it, one rollout at a
time) and SIGKILLs itself when the second rollout of group KILL_GROUP starts:
its first rollout has ended and is stored, the second is left running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

TASKS = [{"id": f"{kind}-{i}", "prompt": f"{kind} question {i}", "data": {"flat": kind == "flat"}}
         for i in range(4) for kind in ("flat", "live")]
BATCH, GROUP, BOUND, MAX_STEPS, SEED = 2, 2, 3, 3, 7


def config(run_dir: Path, model_dir: Path, *, enabled: bool = True, **advanced: Any) -> Any:
    from mtrl_runtime.config import MtrlConfig

    core = {"run_dir": str(run_dir), "model": str(model_dir), "group_size": GROUP, "train_batch_size": BATCH,
            "max_steps": MAX_STEPS, "seed": SEED, "max_turns": 1, "lora_rank": 4, "lora_alpha": 8, "val_every": 0,
            "sampling_params": {"max_tokens": 8}}
    adv = {"checkpoint_every": 0, "rollout_timeout_s": 30,
           "dynamic_sampling": {"enabled": enabled, "max_extra_groups": BOUND}}
    adv.update(advanced)
    return MtrlConfig.from_dict({"core": core, "advanced": adv})


def make_agent(kill_group: str | None = None) -> Any:
    """One model call, then the task's reward; ``kill_group``: SIGKILL when that group's second rollout starts."""
    import openai

    from mtrl_adapters import aupdate_reward, current_rollout, rollout

    clients: dict[int, Any] = {}
    started: Counter[str] = Counter()

    @rollout
    async def agent(task: Any) -> None:
        ctx = current_rollout()
        started[ctx.group_id] += 1
        if ctx.group_id == kill_group and started[ctx.group_id] == 2:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        loop = id(asyncio.get_running_loop())
        if loop not in clients:
            clients[loop] = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
        await clients[loop].chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])
        await aupdate_reward(1.0 if task.data["flat"] else int(ctx.rollout_id[-8:], 16) / 0xFFFFFFFF)

    return agent


def train(run_dir: Path, model_dir: Path, *, agent: Any = None, resume: bool = False, tracking: bool = False,
          progress: bool = False, **advanced: Any) -> Any:
    """A run over TASKS with the scripted engine (replies ``DONE``); the tiny model's LoRA is trained and pushed."""
    import torch

    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.testing import tiny_tokenizer
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = config(run_dir, model_dir, **advanced)
    trainer = MultiTurnRLTrainer(agent_env=agent or make_agent(), training_dataset=TASKS, config=cfg,
                                 engine=ScriptedEngine(tiny_tokenizer(), lambda request, text: "DONE"),
                                 tracking=tracking, resume=resume)
    return trainer.train(progress=progress)


# the killed run: sync, one rollout at a time (so the kill point is exact), a checkpoint after every step
KILLED_RUN = {"checkpoint_every": 1, "max_concurrency": 1}

if __name__ == "__main__":
    run, model, group = sys.argv[1:4]
    train(Path(run), Path(model), agent=make_agent(kill_group=group), **KILLED_RUN)
