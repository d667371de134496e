"""The agent of the multi-host test (``tests/test_hosts.py``), run by Ray workers on the worker hosts.

``host_agent`` is the adapter tests' OpenAI tool loop (``_adapter_tools``):
its model calls go to the coordinator at the rollout's endpoint, on another
host. After its episode it writes what the test checks to
``<task.data["markers"]>/<rollout id>.json`` (the host it ran on, the
endpoint it called, its turns), and on the host ``task.data["hold_on"]``
names it then waits (up to ``hold_s``) before reporting its reward, so the
test can take that host down while the rollout is in flight. The reward is
32 bits of the rollout id, so no two rollouts of a group tie and every
group carries a signal to train on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai

from _adapter_tools import openai_tool_loop
from mtrl_adapters import current_rollout, rollout, update_reward


@rollout
def host_agent(task: Any) -> int:
    import ray

    ctx = current_rollout()
    node = ray.util.get_node_ip_address()
    client = openai.OpenAI(api_key="sk-user-real-key", max_retries=0)
    turns = openai_tool_loop(client, task)
    record = {"rollout_id": ctx.rollout_id, "task_id": task.id, "node": node, "endpoint": ctx.endpoint, "turns": turns}
    (Path(task.data["markers"]) / f"{ctx.rollout_id}.json").write_text(json.dumps(record))
    if node == task.data.get("hold_on"):
        time.sleep(float(task.data.get("hold_s", 60)))  # in flight, its turns recorded, no reward yet
    update_reward(int(ctx.rollout_id[-8:], 16) / 0xFFFFFFFF, {"turns": float(turns)})
    return turns
