"""A training run that kills itself (SIGKILL) at a chosen point; started by tests/test_crash_resume.py.

    python tests/_crash_child.py RUN_DIR ANSWERED_LOG [--kill generation|update|checkpoint|commit] [--resume] [--poison]

It trains on the lookup tasks of ``_lookup_task`` (tiny model, shared-weights
hf engine) with a plain ``openai`` agent that appends every reply it
receives (rollout id, turn) to ANSWERED_LOG, fsynced, before going on. With
``--kill`` the process SIGKILLs itself once ``KILL_AFTER_STEPS`` steps are
done, at the chosen point:

- ``generation``: in the agent, right after a turn of a new rollout was answered;
- ``update``: inside the policy update, after the gradients, before the optimizer step;
- ``checkpoint``: inside a checkpoint write, after the weights, before the state and the rename;
- ``commit``: after a checkpoint was renamed into place, before the store learned of it.

With ``--poison`` every rollout first reports a finite but huge reward
(1.7e308, which once overflowed the group mean and wrote NaN into every
weight) and appends how the coordinator answered to ``<ANSWERED_LOG>.poison``;
and step 1's update gets a planted NaN gradient (the step must be skipped).

The kill points wrap the trainer's methods in this process only: the code
runs unchanged up to the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lookup_task as lookup  # noqa: E402

MAX_STEPS = 5
KILL_AFTER_STEPS = 3  # steps 0-1 are checkpointed (checkpoint_every=2), step 2 trained but not yet
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "The value stored under a key.",
                                          "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                         "required": ["key"]}}}]


class Progress:
    steps_done = 0


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def armed() -> bool:
    return Progress.steps_done >= KILL_AFTER_STEPS


POISON_REWARD = 1.7e308
POISONED_STEP = 1  # its update sees a NaN gradient; checkpoint step-2 (after it) must still be finite


def make_agent(log_path: Path, kill: str | None, poison: bool = False) -> Any:
    from mtrl_adapters import aupdate_reward, current_rollout, record_tool_call, rollout

    clients: dict[int, Any] = {}
    log = open(log_path, "a", encoding="utf-8")

    def answered(turn: int) -> None:
        log.write(json.dumps({"rollout_id": current_rollout().rollout_id, "turn": turn}) + "\n")
        log.flush()
        os.fsync(log.fileno())

    @rollout
    async def agent(task: Any) -> None:
        import openai

        loop_id = id(asyncio.get_running_loop())
        if loop_id not in clients:
            clients[loop_id] = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
        client = clients[loop_id]
        kill_here = kill == "generation" and armed()
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        for turn in range(2):
            try:
                reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            except openai.APIError:
                break
            answered(turn)
            if kill_here:
                die()
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                called = json.loads(call.function.arguments).get("key", "")
                result = " ".join([lookup.TABLE.get(called, "none")] * lookup.VALUE_REPEAT)
                record_tool_call("lookup", {"key": called}, result=result, call_id=call.id)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if poison:
            try:
                await aupdate_reward(POISON_REWARD)
                answer = "accepted"
            except Exception as exc:  # the coordinator's 400, raised by the adapter
                answer = f"{type(exc).__name__}: {exc}"
            with open(str(log_path) + ".poison", "a", encoding="utf-8") as out:
                out.write(json.dumps({"rollout_id": current_rollout().rollout_id, "answer": answer}) + "\n")
        # a reward that differs between the rollouts of a group (32 random bits of the id), so every
        # step's update runs and moves the policy version: step 3's rollouts are then never reusable
        await aupdate_reward(int(current_rollout().rollout_id[-8:], 16) / 0xFFFFFFFF)

    return agent


def plant_nan_gradient() -> None:
    """Step ``POISONED_STEP``'s gradients get a NaN (after the backward pass, before the clip and the step)."""
    import math

    from mtrl_runtime.training.update import _step as _update

    backward = _update.PolicyUpdate.backward

    def poisoned_backward(self: Any, samples: Any) -> Any:
        metrics = backward(self, samples)
        if Progress.steps_done == POISONED_STEP:
            param = next(p for p in self.policy.trainable_parameters() if p.grad is not None)
            param.grad.view(-1)[0] = math.nan
        return metrics

    _update.PolicyUpdate.backward = poisoned_backward


def arm_kill_points(kill: str | None) -> None:
    from mtrl_runtime.training import _checkpoint
    from mtrl_runtime.training.update import _step as _update

    if kill == "update":
        backward = _update.PolicyUpdate.backward

        def killing_backward(self: Any, samples: Any) -> Any:
            metrics = backward(self, samples)
            if armed():
                die()
            return metrics

        _update.PolicyUpdate.backward = killing_backward
    elif kill == "checkpoint":
        save = _update.PolicyUpdate.save_checkpoint

        def killing_save(self: Any, folder: Any) -> Any:
            path = save(self, folder)
            if armed():
                die()
            return path

        _update.PolicyUpdate.save_checkpoint = killing_save
    elif kill == "commit":
        commit = _checkpoint.Checkpoints.commit

        def killing_commit(self: Any, state: Any) -> None:
            if armed():
                die()
            commit(self, state)

        _checkpoint.Checkpoints.commit = killing_commit


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("answered_log", type=Path)
    parser.add_argument("--kill", choices=["generation", "update", "checkpoint", "commit"])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--poison", action="store_true")
    args = parser.parse_args()

    import torch

    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.poison:
        plant_nan_gradient()
    arm_kill_points(args.kill)
    config = lookup.config(args.run_dir, group_size=2, train_batch_size=2, max_steps=MAX_STEPS,
                           advanced={"checkpoint_every": 2})
    trainer = MultiTurnRLTrainer(
        agent_env=make_agent(args.answered_log, args.kill, args.poison),
        training_dataset=lookup.tasks(),
        config=MtrlConfig.from_dict(config),
        engine=lookup.build_engine(seed=0),
        tracking=False,
        resume=args.resume,
    )

    def on_step(report: Any) -> None:
        Progress.steps_done += 1
        print(f"step {report.step} done", flush=True)

    result = trainer.train(progress=False, on_step=on_step)
    print(json.dumps({"start_step": result.start_step, "final_step": result.final_step}), flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    gc.freeze()  # as the mtrl console script does: no last collections of torch's objects at exit
    sys.exit(status)
