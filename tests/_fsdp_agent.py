"""The agent of the torchrun test (tests/test_distributed_cli.py): one model call, a reward that varies.

A plain OpenAI client as the OpenAI SDK's docs write it; the ``@rollout``
decorator points it at the rollout's endpoint. The tiny model writes random
tokens, so the reward is drawn at random: what the test checks is that
every step's update ran over two ranks, not that the agent learns.
"""

from __future__ import annotations

import random
from typing import Any

import openai

from mtrl_adapters import aupdate_reward, rollout


@rollout
async def agent(task: Any) -> None:
    client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task.prompt}], max_tokens=6
    )
    assert reply.choices[0].message is not None
    await aupdate_reward(random.random())
