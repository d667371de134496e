"""``mtrl online`` with real training steps: the tiny model (hidden 64, 2 layers, its byte-level BPE tokenizer trained
in the test session) served by the hf engine, users' sessions recorded through ``learn_online``, delayed feedback,
a step on the learner's own thread, the gate (held-out strict success side by side, tripwires), promotion,
a refused candidate, the staleness bound, rollback over HTTP; and users' latency while a training step runs."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mtrl_adapters import aupdate_reward, record_tool_call, rollout
from mtrl_adapters.online import OnlineClient
from mtrl_integrations.agentcore import learn_online
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.evaluation import StrictScorer
from mtrl_runtime.online import OnlineService, OnlineSettings, judge
from mtrl_runtime.rollouts import GroupResult
from mtrl_runtime.testing import latencies_during_step

pytestmark = pytest.mark.timeout(600)


class Clock:
    def __init__(self) -> None:
        self.now = 5_000_000.0

    def __call__(self) -> float:
        return self.now


def _config(tmp_path: Path, model_dir: Path, **advanced: Any) -> MtrlConfig:
    sampling = {"max_tokens": 8, "temperature": 1.0}
    return MtrlConfig.from_dict({
        "core": {"engine": "hf", "model": str(model_dir), "run_dir": str(tmp_path / "run"), "lora_rank": 4,
                 "lora_alpha": 8, "learning_rate": 0.05, "sampling_params": sampling,
                 "val_sampling_params": sampling, "pass_k_values": [1], "seed": 3},
        "advanced": {"server": {"port": 0}, "reward_range": [0.0, 1.0], "rollout_timeout_s": 60, **advanced},
    })


PEEK = {"on": False}  # when on, the held-out agent reads the answer key: a tripwire's forbidden call
TRIPWIRES = {"wires": [{"kind": "forbidden_call", "name": "answer_key", "tool": "peek_answers"}]}


@rollout
async def gate_agent(task: Any) -> None:
    """The held-out set's agent: one model call (the decorator points the client at the rollout)."""
    client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}],
                                         max_tokens=8)
    if PEEK["on"]:
        record_tool_call("peek_answers", {"task": task.id}, result="42")
    await aupdate_reward(0.0)


def _user_agent(endpoint: str) -> Any:
    """The deployed entrypoint: answers with whatever adapter the coordinator serves now."""

    @learn_online(OnlineClient(endpoint))
    def invoke(payload: dict[str, Any]) -> str:
        client = openai.OpenAI(base_url=endpoint + "/v1", api_key="user-key", max_retries=0)
        reply = client.chat.completions.create(model="policy", max_tokens=8,
                                               messages=[{"role": "user", "content": payload["prompt"]}])
        return reply.choices[0].message.content or ""

    return invoke


def _sessions(invoke: Any, prefix: str) -> list[str]:
    ids = []
    for i in range(4):  # two tasks, two users each: two groups of two
        sid = f"{prefix}-{i}"
        invoke({"prompt": f"how do I reset device {i % 2}?", "session_id": sid})
        ids.append(sid)
    return ids


def _rewarded(url: str, ids: list[str]) -> None:
    client = OnlineClient(url)
    for i, sid in enumerate(ids):
        client.update_reward(sid, 1.0 if i < 2 else 0.0)  # within each task one user happy, one not


def test_a_candidate_is_promoted_only_past_the_gate_and_can_be_rolled_back(tmp_path, tiny_model_dir):
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"id": f"h{i}", "prompt": f"held question {i}"}) + "\n" for i in range(2)))
    prefer = {"serving": None}  # None: every answer passes; else the version the scorer favours

    def strict(rollout_: Any, ground_truth: Any) -> float:
        return 1.0 if prefer["serving"] is None or rollout_.policy_version == prefer["serving"] else 0.0

    settings = OnlineSettings(sample_rate=1.0, group_size=2, groups_per_step=2, max_staleness=0,
                              holdout=str(held), agent="unused:by-start", feedback_expiry_s=3600.0)
    clock = Clock()
    config = _config(tmp_path, tiny_model_dir, tripwires=TRIPWIRES)
    scorer = StrictScorer(strict, input="rollout")
    service = OnlineService.start(config, settings, agent_env=gate_agent, strict=scorer, clock=clock, tick=False)
    try:
        assert service.status()["serving_version"] == 0  # the untrained adapter: the base model's answers
        invoke = _user_agent(service.url)
        first = _sessions(invoke, "day1")
        clock.now += 3600.0 / 2  # half an hour later, the feedback
        _rewarded(service.url, first)
        metrics = service.call(service.tick())
        assert metrics["train/policy_version"] == 1.0 and metrics["samples/count"] == 4.0
        assert metrics["gate/passed"] == 1.0
        status = service.status()
        assert status["serving_version"] == 1 and status["counters"]["trained"] == 4
        assert service.stack.engine.policy_version == 1
        gate = status["last_gate"]
        assert gate["passed"] and gate["candidate_success"] == gate["serving_success"] == 1.0 and not gate["trips"]
        store = service.stack.store
        assert all(store.trained_step(store.get_rollout(service.book.get(s).rollout_id, False).id) == 1 for s in first)

        second = _sessions(invoke, "day2")  # answered by v1 now
        assert {t.policy_version for s in second for t in store.get_rollout(service.book.get(s).rollout_id).turns} == {1}
        _rewarded(service.url, second)
        prefer["serving"] = 1  # a strict scorer that the serving adapter satisfies and the candidate does not
        metrics = service.call(service.tick())
        assert metrics["gate/passed"] == 0.0 and metrics["train/policy_version"] == 2.0
        status = service.status()
        assert status["serving_version"] == 1 and service.stack.engine.policy_version == 1  # not promoted
        assert not status["last_gate"]["passed"] and "below the serving adapter" in status["last_gate"]["reasons"][0]

        third = _sessions(invoke, "day3")  # recorded under v1; the learner is at v2: staleness 1 > 0
        _rewarded(service.url, third)
        service.call(service.tick())
        assert service.status()["counters"]["dropped/stale"] == 4
        assert {service.book.get(s).reason for s in third} == {"stale"}

        answer = httpx.post(service.url + "/online/rollback", timeout=120.0).json()
        assert answer == {"serving_version": 3, "restores": 0, "rolled_back": 1}
        assert service.stack.engine.policy_version == 3 and service.learner.version == 3
        lora_b = [p for n, p in service.learner.update.policy.model.named_parameters() if "lora_B" in n]
        assert lora_b and all(float(p.detach().abs().max()) == 0.0 for p in lora_b)  # v0's weights again: B is zero
        refused = httpx.post(service.url + "/online/rollback", timeout=60.0)
        assert refused.status_code == 409 and "no earlier adapter" in refused.json()["error"]["message"]

        prefer["serving"], PEEK["on"] = None, True  # success alike, but the agent now reads the answer key
        fourth = _sessions(invoke, "day4")  # under v3, the learner's version: fresh
        _rewarded(service.url, fourth)
        metrics = service.call(service.tick())
        gate = service.status()["last_gate"]
        assert metrics["gate/passed"] == 0.0 and gate["trips"] == {"answer_key": 2.0}
        assert "tripwires tripped: answer_key" in gate["reasons"][0] and service.status()["serving_version"] == 3
    finally:
        PEEK["on"] = False
        service.close()

    restarted = OnlineService.start(config, settings, agent_env=gate_agent, strict=scorer, clock=clock, tick=False)
    try:  # the same run folder: what was served is served again, and the sessions and counts are back
        status = restarted.status()
        assert status["serving_version"] == 3 and restarted.stack.engine.policy_version == 3
        assert restarted.learner.version == 3 and status["step"] == 3
        assert status["counters"]["trained"] == 12 and status["counters"]["dropped/stale"] == 4
    finally:
        restarted.close()


def test_the_gate_refuses_a_candidate_that_tripped_a_tripwire_or_scores_below():
    assert judge(2, 1, 0.5, 0.5, {}).passed
    tripped = judge(2, 1, 0.9, 0.5, {"honeypot": 1.0, "leak": 0.0})
    assert not tripped.passed and tripped.trips == {"honeypot": 1.0} and "honeypot" in tripped.reasons[0]
    lower = judge(2, 1, 0.25, 0.5, {})
    assert not lower.passed and "0.250" in lower.reasons[0] and "0.500" in lower.reasons[0]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_no_user_request_waits_on_a_training_step(tmp_path, tiny_model_dir):
    """User latency (p50/p99) while one long training step runs on the learner's thread, against idle."""
    settings = OnlineSettings(sample_rate=1.0, group_size=2, groups_per_step=2)
    service = OnlineService.start(_config(tmp_path, tiny_model_dir), settings, clock=Clock(), tick=False)
    try:
        invoke = _user_agent(service.url)
        ids = _sessions(invoke, "lat")
        store = service.stack.store
        rollouts = [replace(store.get_rollout(service.book.get(s).rollout_id), reward=float(i < 2))
                    for i, s in enumerate(ids)]
        task = store.get_task(rollouts[0].task_id)
        groups = [GroupResult(f"g{i}", task, tuple(rollouts[i::2]), tuple(rollouts[i::2]), False) for i in range(2)]
        batch = service.learner.prepare(groups)
        assert batch.samples
        http = httpx.Client(base_url=service.url, timeout=120.0)

        def ask() -> tuple[float, float]:
            start = time.perf_counter()
            r = http.post("/v1/chat/completions", json={"model": "policy", "max_tokens": 8,
                                                         "messages": [{"role": "user", "content": "hello"}]})
            assert r.status_code == 200, r.text
            return start, time.perf_counter()

        idle = [e - s for s, e in (ask() for _ in range(20))]
        repeat = 200  # one step over many samples: seconds long; more where this CPU takes under 1 s for it
        for _ in range(3):
            step_s, inside = latencies_during_step(service, replace(batch, samples=batch.samples * repeat), ask)
            if step_s > 1.0:
                break
            repeat = int(repeat * 2.0 / max(step_s, 0.1))  # aim at 2 s
        print(f"\nonline latency: step {step_s:.2f} s; idle p50 {statistics.median(idle) * 1e3:.0f} ms "
              f"p99 {_p(idle, 0.99) * 1e3:.0f} ms (n={len(idle)}); during the step p50 "
              f"{statistics.median(inside) * 1e3:.0f} ms p99 {_p(inside, 0.99) * 1e3:.0f} ms (n={len(inside)})")
        assert step_s > 1.0, step_s  # the step is long enough to tell waiting from not waiting
        assert len(inside) >= 3  # users were answered while the step ran, not after it
        assert _p(inside, 0.99) < step_s / 2
    finally:
        service.close()


GATE_AGENT = '''
import openai
from mtrl_adapters import aupdate_reward, rollout


@rollout
async def gate(task):
    client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}],
                                         max_tokens=8)
    await aupdate_reward(0.0)


def anything(text, ground_truth):
    return 1.0
'''


def test_mtrl_online_ticks_trains_promotes_and_rolls_back_from_the_command_line(tmp_path, tiny_model_dir, capsys):
    import subprocess
    import sys

    import yaml

    from mtrl_runtime.cli import main

    (tmp_path / "gate_agent.py").write_text(GATE_AGENT)
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"id": "h0", "prompt": "held question"}) + "\n")
    config = _config(tmp_path, tiny_model_dir).model_dump(mode="json")
    config["online"] = {"sample_rate": 1.0, "group_size": 2, "groups_per_step": 2, "tick_s": 0.2,
                        "holdout": str(held), "agent": f"{tmp_path / 'gate_agent.py'}:gate",
                        "strict": f"{tmp_path / 'gate_agent.py'}:anything"}
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "mtrl_runtime.cli", "online", str(path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert "mtrl: online on http://127.0.0.1:" in line and "serving adapter v0" in line, line + proc.stderr.read()
        url = line.split(" on ")[1].split("/v1")[0]
        invoke = _user_agent(url)
        _rewarded(url, _sessions(invoke, "cli"))
        deadline = time.monotonic() + 300
        while (status := httpx.get(url + "/online/status").json())["serving_version"] != 1:
            assert time.monotonic() < deadline, status
            time.sleep(0.5)  # the service's own tick trains the two groups and gates the candidate
        assert status["step"] == 1 and status["last_gate"]["passed"] and status["counters"]["trained"] == 4
        capsys.readouterr()
        assert main(["online", str(path), "--rollback", "--url", url]) == 0
        assert json.loads(capsys.readouterr().out) == {"serving_version": 2, "restores": 0, "rolled_back": 1}
        assert httpx.get(url + "/online/status").json()["serving_version"] == 2
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "mtrl: stopped" in err, err[-3000:]
