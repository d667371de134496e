"""A synthetic two-step tool task that a tiny randomly initialised model learns in a few RL steps.

The agent is a real Strands ``Agent`` with one tool, ``lookup(key)``, whose
model is a Strands ``OpenAIModel`` pointed at nothing in particular: the
``@rollout`` decorator sends its calls to the coordinator. A task names a
key; the episode succeeds when the agent calls ``lookup`` exactly once with
that key and then answers with the value the tool returned.

What makes it learnable in seconds by a model with random weights:

- a word-level tokenizer of 20 entries: the special tokens, the keys and the
  values, plus one added token per possible tool call (the whole
  ``<tool_call>{...}</tool_call>`` block of ``lookup(K0)``..``lookup(K3)``);
  everything else in a prompt is ``[UNK]``;
- the engine ends a completion at any tool-call or value token (they are
  its eos ids), so one sampled token is one decision among nine, and
  ``max_tokens`` is small;
- one key in the training tasks, so the policy needs no attention to learn
  *which* call: it learns the two-step protocol (the right call among four,
  then the right answer among four values and not another call).

Rewards per turn (``group_based_per_turn`` advantages): turn 1 earns 0.5
when its call names the task's key; turn 2 earns 0.5 when it answers the
right value without calling again, and loses 0.5 when it calls again (else
a policy that learned "call the tool" at turn 1 drifts into calling at turn
2 as well, and a group that always does so carries no signal). The tool's
result repeats its value many times, so the answer turn's context looks
unlike the first. A random policy scores about 0.05; a good one 1.0.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

KEYS = ("K0", "K1", "K2", "K3")
TABLE = {"K0": "red", "K1": "green", "K2": "blue", "K3": "gold"}
TRAIN_KEY = "K2"
VALUE_REPEAT = 64  # the tool's result says its value many times: the answer turn looks unlike the first
PENALTY = 0.5  # turn 2 calling the tool again
TOOL_LATENCY_S = 0.0  # benchmarks set it to stand for a real tool's I/O


def tool_call_text(key: str) -> str:
    return '<tool_call>\n{"name": "lookup", "arguments": {"key": "%s"}}\n</tool_call>' % key


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", *TABLE.values()]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="[UNK]",
    )
    tokenizer.add_tokens([tool_call_text(k) for k in KEYS])
    return tokenizer


def stop_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a completion: every tool call, every value, and <|im_end|>."""
    words = [tool_call_text(k) for k in KEYS] + list(TABLE.values())
    return [tokenizer.convert_tokens_to_ids(w) for w in words] + [tokenizer.eos_token_id]


def build_model(tokenizer: Any, seed: int = 0) -> Any:
    from mtrl_runtime.testing import tiny_model

    return tiny_model(tokenizer, hidden_size=64, layers=2, seed=seed)


def build_engine(seed: int = 0) -> Any:
    from mtrl_runtime.engines import HFEngine

    tokenizer = build_tokenizer()
    return HFEngine.from_objects(build_model(tokenizer, seed), tokenizer, eos_token_ids=stop_ids(tokenizer))


def save_model(folder: Any, seed: int = 0) -> Any:
    """The tokenizer and a fresh model as a local folder (for ``mtrl train`` in a subprocess)."""
    tokenizer = build_tokenizer()
    build_model(tokenizer, seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tasks(n: int = 4, key: str = TRAIN_KEY) -> list[dict[str, Any]]:
    return [{"id": f"lookup-{key}-{i}", "prompt": key, "data": {"key": key}} for i in range(n)]


def config(run_dir: Any, **core: Any) -> dict[str, Any]:
    """The recipe: full fine-tuning at a high learning rate, many small steps (2 prompts x 8 rollouts)."""
    advanced = core.pop("advanced", {})
    base = {
        "run_dir": str(run_dir),
        "group_size": 8,
        "train_batch_size": 2,
        "max_steps": 60,
        "learning_rate": 1e-2,
        "advantage_method": "group_based_per_turn",
        "max_turns": 2,
        "sampling_params": {"max_tokens": 2, "temperature": 1.0},
    }
    base.update(core)
    adv = {"full_finetune": True, "checkpoint_every": 0, "max_concurrency": 32, "rollout_timeout_s": 60}
    adv.update(advanced)
    return {"core": base, "advanced": adv}


_CLIENTS: dict[int, Any] = {}  # one AsyncOpenAI client per event loop (Strands would make one per call)


def _client() -> Any:
    import openai

    loop = asyncio.get_running_loop()
    if id(loop) not in _CLIENTS:
        _CLIENTS[id(loop)] = openai.AsyncOpenAI(base_url="http://agent-default.invalid/v1", api_key="unused")
    return _CLIENTS[id(loop)]


def _agent_body(jitter: bool = False) -> Any:
    """The Strands agent; with ``jitter`` its final reward also carries up to 1e-3 from the rollout id,
    so the rollouts of a group never tie and every step's update runs (tests of resume need that)."""
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from mtrl_adapters import aupdate_reward, current_rollout, rollout
    from mtrl_adapters.strands import attach

    @rollout
    async def agent(task: Any) -> None:
        calls: list[str] = []

        @tool
        def lookup(key: str) -> str:
            """The value stored under a key."""
            calls.append(key)
            if TOOL_LATENCY_S:
                time.sleep(TOOL_LATENCY_S)  # Strands runs sync tools in a worker thread
            return " ".join([TABLE.get(key, "none")] * VALUE_REPEAT)

        model = OpenAIModel(client=_client(), model_id="policy")
        strands_agent = attach(Agent(model=model, tools=[lookup], system_prompt="Look the key up, then answer.",
                                     callback_handler=None))
        key = task.data["key"]
        try:
            answer = str(await strands_agent.invoke_async(task.prompt)).strip()
        except Exception:  # a length cut, or a third call past max_turns: the episode ends there
            answer = None
        called_right = calls[:1] == [key]  # turn 1: the first call names the task's key
        answer_ok = calls == [key] and answer == TABLE[key]  # turn 2: no second call, the right value
        # per-turn rewards: the call is judged at turn 1, the answer at turn 2 (no turn 2 without a
        # call); calling again at turn 2 costs a little, so turn 2 does not drift into turn 1's habit
        second = 0.5 if answer_ok else (-PENALTY if len(calls) > 1 else 0.0)
        turn_rewards = [0.5 * called_right, second] if calls else [0.0]
        if jitter:
            turn_rewards[-1] += 1e-3 * int(current_rollout().rollout_id[-8:], 16) / 0xFFFFFFFF
        await aupdate_reward(turn_rewards, {"tool_ok": float(called_right), "answer_ok": float(answer_ok)})

    return agent


agent = _agent_body()
agent_with_signal = _agent_body(jitter=True)
