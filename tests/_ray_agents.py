"""Agents the Ray executor tests run in Ray workers (importable there: the tests put this folder on PYTHONPATH).

Each is the adapter tests' OpenAI tool loop (``_adapter_tools``): the
rollout's model calls go to the coordinator over HTTP, redirected by the
``@rollout`` decorator. ``KILL_KEY`` makes the worker process exit hard
(``os._exit``) in the middle of its episode, after its first model call.
``once_marker`` makes that happen only the first time (a file records it),
so a retried rollout succeeds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import openai

from _adapter_tools import TOOLS, afinish_episode, aopenai_tool_loop, finish_episode, key_of, openai_tool_loop
from mtrl_adapters import rollout

KILL_KEY = "K07"


def _should_die(task: Any) -> bool:
    if key_of(task.prompt) != KILL_KEY:
        return False
    marker = task.data.get("once_marker")
    if marker is None:
        return True
    if Path(marker).exists():
        return False
    Path(marker).write_text("killed once")
    return True


@rollout
def sync_agent(task: Any) -> int:
    client = openai.OpenAI(api_key="sk-user-real-key", max_retries=0)
    if _should_die(task):  # one model call is recorded, then the worker process dies
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}], tools=TOOLS)
        os._exit(3)
    turns = openai_tool_loop(client, task)
    finish_episode(task, turns)
    return turns


@rollout
async def async_agent(task: Any) -> int:
    client = openai.AsyncOpenAI(api_key="sk-user-real-key", max_retries=0)
    if _should_die(task):
        os._exit(3)
    turns = await aopenai_tool_loop(client, task)
    await afinish_episode(task, turns)
    return turns


def worker_pid(task: Any) -> int:
    """Not a rollout agent: reports which process ran it (undecorated; the executor decorates it)."""
    return os.getpid()


@rollout
def slow_agent(task: Any) -> None:
    """Sleeps past any short timeout (a sync agent cannot be interrupted inside its worker)."""
    time.sleep(float(task.data["sleep_s"]))


@rollout
def node_agent(task: Any) -> int:
    """``sync_agent``'s episode, after writing the id of the Ray node it runs on to ``task.data["node_file"]``."""
    import ray

    Path(task.data["node_file"]).write_text(ray.get_runtime_context().get_node_id())
    client = openai.OpenAI(api_key="sk-user-real-key", max_retries=0)
    turns = openai_tool_loop(client, task)
    finish_episode(task, turns)
    return turns
