"""``mtrl online``'s wiring on loopback with the scripted engine: an AgentCore app (``BedrockAgentCoreApp``, served
over HTTP as AgentCore serves it) wrapped with ``learn_online`` answers a scripted population of users; a share of
their sessions is recorded; feedback arrives later (a fake clock moves minutes and days) through the HTTP route
and the Python client; expired feedback is dropped and counted, unknown sessions are refused, and a restart
loses no pending session. Real training, the gate and rollback: ``test_online_training.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from bedrock_agentcore import BedrockAgentCoreApp

from mtrl_adapters import RolloutError, current_rollout
from mtrl_adapters.online import OnlineClient
from mtrl_integrations.agentcore import learn_online
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.engines.scripted import ScriptedEngine
from mtrl_runtime.online import OnlineService, OnlineSettings, load_online_config, sampled
from mtrl_runtime.server import start_server

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _service(tmp_path: Path, tiny_tok: Any, clock: Clock, **online: Any) -> OnlineService:
    config = MtrlConfig.from_dict({"core": {"engine": "scripted", "run_dir": str(tmp_path / "run")},
                                   "advanced": {"server": {"port": 0}, "reward_range": [0.0, 1.0]}})
    settings = OnlineSettings(**{"sample_rate": 0.5, "feedback_expiry_s": 3600.0, "group_size": 2, **online})
    engine = ScriptedEngine(tiny_tok, lambda request, text: f"ANSWER {len(text) % 7}")
    return OnlineService.start(config, settings, engine=engine, learn=False, clock=clock, tick=False)


def _agent_app(endpoint: str, served: list[dict[str, Any]]) -> BedrockAgentCoreApp:
    """The deployed agent, as the AgentCore docs write one, pointed at the coordinator's OpenAI endpoint."""
    app = BedrockAgentCoreApp()

    @app.entrypoint
    @learn_online(OnlineClient(endpoint))
    async def invoke(payload, context):
        client = openai.AsyncOpenAI(base_url=endpoint + "/v1", api_key="user-key", max_retries=0)
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": payload["prompt"]}], max_tokens=16)
        ctx = current_rollout()
        served.append({"session": context.session_id, "rollout": ctx.rollout_id if ctx else None})
        return {"answer": reply.choices[0].message.content}

    return app


def _users(app_url: str, sessions: list[str]) -> list[dict[str, Any]]:
    with httpx.Client(timeout=30.0) as http:
        return [http.post(app_url + "/invocations", json={"prompt": f"question of {sid}"},
                          headers={SESSION_HEADER: sid}).json() for sid in sessions]


def test_users_are_answered_a_share_is_recorded_and_delayed_feedback_becomes_reward(tmp_path, tiny_tok):
    clock = Clock()
    service = _service(tmp_path, tiny_tok, clock)
    served: list[dict[str, Any]] = []
    app = start_server(_agent_app(service.url, served), "127.0.0.1", 0)
    try:
        sessions = [f"user-{i}" for i in range(24)]
        answers = _users(app.url, sessions)
        assert all(a["answer"].startswith("ANSWER") for a in answers), answers  # every user answered
        drawn = [s for s in sessions if sampled(s, 0.5)]
        assert 0 < len(drawn) < len(sessions)
        recorded = {r["session"] for r in served if r["rollout"]}
        assert recorded == set(drawn)  # exactly the drawn sessions ran inside a rollout
        store = service.stack.store
        rollouts = store.rollouts(group_id="online")
        assert len(rollouts) == len(drawn) and all(r.turns for r in rollouts)  # their model calls were captured
        assert service.status()["counters"]["not_sampled"] == len(sessions) - len(drawn)

        feedback = OnlineClient(service.url)
        early, late = drawn[: len(drawn) // 2], drawn[len(drawn) // 2:]
        clock.now += 60.0  # a minute later: a thumbs-up
        for sid in early:
            assert feedback.update_reward(sid, 1.0).state == "rewarded"
        undrawn = next(s for s in sessions if s not in drawn)
        assert feedback.update_reward(undrawn, 1.0).recorded is False  # not recorded: nothing to train, counted
        with pytest.raises(RolloutError) as again:
            feedback.update_reward(early[0], 0.0)
        assert again.value.status == 409 and early[0] in again.value.message
        never = next(f"ghost-{i}" for i in range(1000) if sampled(f"ghost-{i}", 0.5))
        with pytest.raises(RolloutError) as unknown:
            feedback.update_reward(never, 1.0)
        assert unknown.value.status == 404 and never in unknown.value.message and "no recorded session" in unknown.value.message

        clock.now += 2 * 24 * 3600.0  # two days later: past the hour's expiry
        with pytest.raises(RolloutError) as expired:
            feedback.update_reward(late[0], 1.0)
        assert expired.value.status == 410 and "expiry" in expired.value.message and late[0] in expired.value.message
        service.call(service.tick())  # the sweep drops the rest, counted
        counters = service.status()["counters"]
        assert counters["dropped/expired"] == len(late)
        assert counters["rewarded"] == len(early) and counters["feedback/unknown"] == 1
        assert counters["feedback/not_sampled"] == 1 and counters["feedback/late"] == 1
        assert dict((n, v) for _, n, v in store.metric_history("online/dropped/expired"))["online/dropped/expired"] == len(late)
        with pytest.raises(RolloutError) as after:
            feedback.update_reward(late[-1], 1.0)
        assert after.value.status == 410
    finally:
        app.stop()
        service.close()


def test_a_restart_loses_no_pending_session_and_keeps_the_counts(tmp_path, tiny_tok):
    clock = Clock()
    service = _service(tmp_path, tiny_tok, clock, sample_rate=1.0)
    served: list[dict[str, Any]] = []
    app = start_server(_agent_app(service.url, served), "127.0.0.1", 0)
    try:
        _users(app.url, ["a", "b", "c"])
        OnlineClient(service.url).update_reward("a", 0.5)
    finally:
        app.stop()
        service.close()
    clock.now += 600.0
    again = _service(tmp_path, tiny_tok, clock, sample_rate=1.0)
    try:
        status = again.status()
        assert status["open"] == {"pending": 2, "rewarded": 1} and status["counters"]["opened"] == 3
        assert again.book.get("a").reward == 0.5
        client = OnlineClient(again.url)
        assert client.update_reward("b", 1.0).state == "rewarded"  # feedback after the restart still lands
        groups = again.book.ready_groups()  # group_size 2, grouped by task: "a" and "b" asked different things
        assert groups == []
    finally:
        again.close()


def test_groups_form_from_similar_tasks_or_from_the_feedback_s_own_key(tmp_path, tiny_tok):
    clock = Clock()
    service = _service(tmp_path, tiny_tok, clock, sample_rate=1.0)
    try:
        http = httpx.Client(base_url=service.url, timeout=30.0)
        for sid, prompt in (("s1", "Reset my  PASSWORD"), ("s2", "reset my password"), ("s3", "other thing")):
            opened = http.post("/online/sessions", json={"session_id": sid, "instance": {"prompt": prompt}}).json()
            assert opened["sampled"] and opened["request"]["metadata"]["rollout_token"]
        dup = http.post("/online/sessions", json={"session_id": "s1", "instance": {"prompt": "x"}})
        assert dup.status_code == 409 and "s1" in dup.json()["error"]["message"]
        bad = http.post("/online/feedback", json={"session_id": "s1", "reward": "lots"})
        assert bad.status_code == 400 and "reward" in bad.json()["error"]["message"] and "lots" in bad.json()["error"]["message"]
        out = http.post("/online/feedback", json={"session_id": "s1", "reward": 7.0})
        assert out.status_code == 400 and "reward_range" in out.json()["error"]["message"]
        for sid in ("s1", "s2", "s3"):
            assert http.post("/online/feedback", json={"session_id": sid, "reward": 1.0}).status_code == 200
        groups = service.book.ready_groups()
        assert [[s.session_id for s in g] for g in groups] == [["s1", "s2"]]  # the same task, normalised
        clock.now += 3601.0  # nothing trains here (no learner): at their expiry the rewarded sessions are dropped
        service.call(service.tick())  # and counted, like unrewarded ones (s3's group never filled at all)
        assert {service.book.get(s).reason for s in ("s1", "s2", "s3")} == {"ungrouped"}
        assert service.status()["counters"]["dropped/ungrouped"] == 3
    finally:
        service.close()

    keyed = _service(tmp_path / "keyed", tiny_tok, clock, sample_rate=1.0, group_by="feedback_key")
    try:
        http = httpx.Client(base_url=keyed.url, timeout=30.0)
        for sid in ("k1", "k2", "k3"):
            http.post("/online/sessions", json={"session_id": sid, "instance": {"prompt": f"ticket {sid}"}})
        missing = http.post("/online/feedback", json={"session_id": "k1", "reward": 1.0})
        assert missing.status_code == 400 and "group_key" in missing.json()["error"]["message"]
        for sid, key in (("k1", "billing"), ("k2", "shipping"), ("k3", "billing")):
            assert http.post("/online/feedback", json={"session_id": sid, "reward": 1.0, "group_key": key}).status_code == 200
        assert [[s.session_id for s in g] for g in keyed.book.ready_groups()] == [["k1", "k3"]]
    finally:
        keyed.close()


@pytest.mark.parametrize("section, key, value", [
    ({"sample_rate": 1.5}, "online.sample_rate", "1.5"),
    ({"sample_rate": 0}, "online.sample_rate", "0"),
    ({"feedback_expiry_s": -1}, "online.feedback_expiry_s", "-1"),
    ({"group_by": "vibes"}, "online.group_by", "vibes"),
    ({"group_size": 1}, "online.group_size", "1"),
    ({"max_staleness": -2}, "online.max_staleness", "-2"),
    ({"samplerate": 0.2}, "online.samplerate", "0.2"),
    ({"holdout": "held.jsonl"}, "online.agent", "held.jsonl"),
])
def test_bad_online_settings_fail_at_load_naming_the_field_and_the_value(tmp_path, section, key, value):
    path = tmp_path / "online.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"core": {"engine": "scripted"}, "online": section}))
    with pytest.raises(ConfigError) as err:
        load_online_config(path)
    assert key in str(err.value) and value in str(err.value) and str(path) in str(err.value)


def test_the_cli_reports_a_bad_config_and_a_refused_rollback(tmp_path, tiny_tok, capsys):
    from mtrl_runtime.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("core: {engine: scripted}\nonline: {sample_rate: 2}\n")
    assert main(["online", str(bad)]) == 2
    assert "online.sample_rate" in capsys.readouterr().err
    service = _service(tmp_path, tiny_tok, Clock())
    try:
        good = tmp_path / "good.yaml"
        good.write_text("core: {engine: scripted}\n")
        assert main(["online", str(good), "--rollback", "--url", service.url]) == 1
        assert "no earlier adapter" in capsys.readouterr().err  # nothing was promoted: nothing to go back to
    finally:
        service.close()


def test_with_an_api_key_the_online_routes_need_it(tmp_path, tiny_tok):
    config = MtrlConfig.from_dict({"core": {"engine": "scripted", "run_dir": str(tmp_path / "run")},
                                   "advanced": {"server": {"port": 0, "api_key": "s3cret"}}})
    engine = ScriptedEngine(tiny_tok, lambda request, text: "ANSWER 1")
    service = OnlineService.start(config, OnlineSettings(sample_rate=1.0), engine=engine, learn=False,
                                  clock=Clock(), tick=False)
    try:
        body = {"session_id": "s", "instance": {"prompt": "hi"}}
        refused = httpx.post(service.url + "/online/sessions", json=body)
        assert refused.status_code == 401 and "api key" in refused.json()["error"]["message"]
        assert httpx.get(service.url + "/online/status", headers={"authorization": "Bearer nope"}).status_code == 401
        client = OnlineClient(service.url, api_key="s3cret")
        assert client.open_session("s", {"prompt": "hi"}).sampled
        assert client.update_reward("s", 0.5).state == "rewarded"
    finally:
        service.close()
