"""Harness CLIs run unchanged as rollouts: Claude Code, Codex CLI, opencode and gemini-cli, from the npm registry, pinned.

Each runs headless in its rollout's bubblewrap sandbox against a training coordinator (the scripted engine
drives real tool use: the harness really runs a shell command that writes a file), pointed at the rollout with only
its documented base-URL and key settings (``mtrl_runtime.harnesses``). Every model call is recorded with its
prompt ids, completion ids and logprobs as one growing sequence; the tools the harness ran are stored from the wire
with their results; the reward comes from the workspace. A harness that runs past its time fails its rollout with
the reason. ``scripts/setup.sh dev`` installs the harnesses (``$MTRL_HARNESS_DIR``, else ``.venv/harnesses``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from _sandbox_support import require, sandbox_root
from mtrl_adapters import rollout, update_reward
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.harnesses import HARNESSES, install_harness, run_harness
from mtrl_runtime.rollouts import collect_rollouts
from mtrl_runtime.run_folder import RunFolder
from mtrl_runtime.sandboxes import rollout_sandbox
from mtrl_runtime.store import open_store
from mtrl_runtime.types import RolloutStatus, Task

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("MTRL_HARNESS_DIR") or REPO / ".venv" / "harnesses")
COMMAND = "echo hello > out.txt && cat out.txt"
CALLS = {  # each harness's own shell tool, as it declares it
    "claude_code": ("Bash", {"command": COMMAND, "description": "Write the file"}),
    "codex": ("exec_command", {"cmd": COMMAND}),
    "opencode": ("bash", {"command": COMMAND, "description": "Write the file"}),
    "gemini_cli": ("run_shell_command", {"command": COMMAND, "description": "Write the file"}),
}

root_dir = pytest.fixture(sandbox_root)


def _installed(name: str) -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH (Node.js 20+ installs the harness CLIs)")
    return install_harness(HARNESSES.get(name), ROOT)


def _config(run_dir: Path, root: Path, replies: list) -> MtrlConfig:
    script = run_dir / "script.json"
    script.write_text(json.dumps(replies))
    return MtrlConfig.from_dict({
        "core": {"model": "smollm2-135m", "engine": "scripted", "group_size": 1, "run_dir": str(run_dir)},
        "advanced": {"engine_options": {"script_file": str(script)}, "rollout_timeout_s": 300,
                     "sandbox": {"kind": "bubblewrap", "root": str(root), "timeout_s": 240, "memory_mb": 8192,
                                 "ro_paths": [str(ROOT)]}},
    })


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_harness_runs_a_rollout_unchanged_with_every_call_and_tool_recorded(name, tmp_path, root_dir):
    require("bubblewrap")
    _installed(name)
    tool, arguments = CALLS[name]
    seen = {}

    @rollout
    async def agent(task: Task) -> None:
        async with rollout_sandbox(coordinator=True) as box:
            result = (await run_harness(name, box, task.prompt, timeout_s=240, install_root=ROOT)).check()
            seen["output"] = result.output
            written = await box.run("cat out.txt")
        update_reward(float(written.stdout.strip() == "hello"))

    config = _config(tmp_path, root_dir, [{"tool_call": {"name": tool, "arguments": arguments}}, "Done."])
    collected = asyncio.run(collect_rollouts(config, agent, [Task(id="hello", prompt="Write hello to out.txt.")]))
    [done] = collected.rollouts
    assert done.status is RolloutStatus.COMPLETED and done.reward == 1.0, (done.error, seen)
    assert "Done." in seen["output"]
    stored = open_store(RunFolder(tmp_path).store).get_rollout(done.id)
    assert len(stored.turns) == 2
    for turn in stored.turns:
        assert turn.prompt_ids and turn.completion_ids and len(turn.logprobs) == len(turn.completion_ids)
    first, second = stored.turns
    assert second.break_reason is None  # one growing sequence: the second prompt extends the first turn
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
    [call] = stored.tool_calls  # what the harness ran, from the wire, with what it read back
    assert (call.name, call.arguments, call.turn_index, call.status) == (tool, arguments, 0, "success")
    assert "hello" in call.result
    assert "tool_calls_unrecorded" not in stored.metrics


def test_a_harness_past_its_time_fails_its_rollout_with_the_reason(tmp_path, root_dir):
    require("bubblewrap")
    _installed("claude_code")

    @rollout
    async def agent(task: Task) -> None:
        async with rollout_sandbox(coordinator=True) as box:
            (await run_harness("claude_code", box, task.prompt, timeout_s=3, install_root=ROOT)).check()
        update_reward(1.0)

    slow = {"text": "Thinking...", "delay_s": 30}
    config = _config(tmp_path, root_dir, [slow, slow])
    collected = asyncio.run(collect_rollouts(config, agent, [Task(id="slow", prompt="Take your time.")]))
    [done] = collected.rollouts
    assert done.status is RolloutStatus.FAILED
    assert "HarnessFailed: harness 'claude_code': killed at its deadline" in done.error, done.error


def test_a_harness_outside_the_sandbox_view_is_refused_naming_ro_paths(tmp_path, root_dir):
    require("bubblewrap")
    _installed("codex")

    @rollout
    async def agent(task: Task) -> None:
        async with rollout_sandbox(coordinator=True) as box:
            await run_harness("codex", box, task.prompt, install_root=ROOT)

    config = _config(tmp_path, root_dir, ["Done."])
    config.advanced.sandbox.ro_paths = []
    collected = asyncio.run(collect_rollouts(config, agent, [Task(id="hidden", prompt="Anything.")]))
    [done] = collected.rollouts
    assert done.status is RolloutStatus.FAILED and "advanced.sandbox.ro_paths" in done.error, done.error


def test_a_harness_that_exits_non_zero_fails_its_rollout_with_its_last_words(tmp_path, root_dir):
    require("bubblewrap")
    _installed("codex")

    @rollout
    async def agent(task: Task) -> None:
        async with rollout_sandbox(coordinator=True) as box:
            (await run_harness("codex", box, task.prompt, timeout_s=120, install_root=ROOT)).check()
        update_reward(1.0)

    config = _config(tmp_path, root_dir, [{"error": "the engine broke"}])  # the policy's turn fails: a 5xx
    collected = asyncio.run(collect_rollouts(config, agent, [Task(id="broken", prompt="Anything.")]))
    [done] = collected.rollouts
    assert done.status is RolloutStatus.FAILED and done.reward != 1.0
    assert "HarnessFailed: harness 'codex': exit " in done.error, done.error
