"""MLflow: a short training run's params, metrics, adapter and traces, read back with the MLflow client."""

from __future__ import annotations

import json

import pytest

import _lookup_task as lookup
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.testing import free_port
from mtrl_runtime.tracking import default_tracking_uri, flatten_params, metric_key
from mtrl_runtime.training import MultiTurnRLTrainer


def test_flatten_params_and_metric_keys():
    assert flatten_params({"core": {"group_size": 8, "stop": ["a"]}, "x": {}}) == {
        "core.group_size": "8", "core.stop": "['a']", "x": "{}",
    }
    assert metric_key("rollout/metrics/field acc") == "rollout/metrics/field acc"
    assert metric_key("rollout/metrics/f1@k") == "rollout/metrics/f1_k"


@pytest.mark.timeout(240)
def test_metrics_params_adapter_and_one_trace_per_trajectory_read_back(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    cfg = MtrlConfig.from_dict(lookup.config(tmp_path / "run", max_steps=2, train_batch_size=1, group_size=4))
    result = MultiTurnRLTrainer(
        agent_env=lookup.agent, training_dataset=lookup.tasks(), config=cfg, engine=lookup.build_engine(),
    ).train(progress=False)

    assert result.tracking_uri == default_tracking_uri(tmp_path / "run")
    assert (tmp_path / "run" / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=result.tracking_uri)
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["core.group_size"] == "4"
    assert run.data.params["core.advantage_method"] == "group_based_per_turn"
    for name in ("rollout/reward/mean", "rollout/reward/zero_frac", "rollout/reward/reported_mean",
                 "rollout/turns/mean", "rollout/tokens/response_max", "analysis/zero_adv_groups",
                 "rollout/metrics/tool_ok", "time/step", "failures/permanent_rate"):
        history = client.get_metric_history(result.mlflow_run_id, name)
        assert [m.step for m in history] == [0, 1], name
    # SageMaker's valid_mean averages the groups with non-zero advantage: logged at exactly the steps that had one
    with_signal = [r.step for r in result.reports if r.metrics["analysis/zero_adv_groups"] < 1]
    valid = client.get_metric_history(result.mlflow_run_id, "rollout/reward/valid_mean")
    assert [m.step for m in valid] == with_signal
    assert [m.value for m in valid] == pytest.approx(
        [r.metrics["rollout/reward/valid_mean"] for r in result.reports if r.step in with_signal])
    logged = [m.value for m in client.get_metric_history(result.mlflow_run_id, "rollout/reward/mean")]
    assert logged == pytest.approx([r.metrics["rollout/reward/mean"] for r in result.reports])
    assert "adapter" in {a.path for a in client.list_artifacts(result.mlflow_run_id)}

    mlflow.set_tracking_uri(result.tracking_uri)
    traces = mlflow.search_traces(locations=[run.info.experiment_id], return_type="list", flush=True)
    assert len(traces) == 2 * 4  # one per rollout: 2 steps x 1 task x 4
    for trace in traces:
        tags = trace.info.tags
        assert {"mtrl.rollout_id", "mtrl.group_id", "mtrl.step", "mtrl.reward"} <= set(tags)
        assert tags["mtrl.chat_format"] == "hermes"  # the endpoint's format: warm start parses replies back with it
        spans = trace.data.spans
        llm = [s for s in spans if s.name.startswith("llm turn")]
        tools = [s for s in spans if s.name.startswith("tool ")]
        assert llm, "every rollout made at least one model call"
        assert all("messages" in s.inputs and "content" in s.outputs for s in llm)
        assert all([t["function"]["name"] for t in s.inputs["tools"]] == ["lookup"] for s in llm)  # definitions
        assert all(s.inputs["name"] == "lookup" and "key" in s.inputs["arguments"] for s in tools)
        text = json.dumps(trace.to_dict())
        assert "prompt_ids" not in text and "completion_ids" not in text and "logprobs" not in text
    by_step = sorted(int(t.info.tags["mtrl.step"]) for t in traces)
    assert by_step == [0] * 4 + [1] * 4
    tool_spans = [s for t in traces for s in t.data.spans if s.name == "tool lookup"]
    assert all(s.outputs["result"].split()[0] in lookup.TABLE.values() for s in tool_spans)  # what the tool returned


def test_a_tool_span_says_where_the_tool_ran(tmp_path):
    """Each tool span carries ``mtrl.source``: ``mcp:<server>`` for a tool an MCP server served, ``local`` for the
    agent's own, so the two can be told apart in MLflow's trace view."""
    import mlflow

    from mtrl_runtime.tracking import Tracker
    from mtrl_runtime.types import Rollout, RolloutStatus, ToolCall

    calls = (ToolCall("r-1", "lookup", {"key": "A1"}, call_id="c1", result="42", turn_index=0, started_at=1.0,
                      latency_s=0.1, source="mcp:notes"),
             ToolCall("r-1", "double", {"x": 21}, call_id="c2", result=42, turn_index=1, started_at=2.0, latency_s=0.1))
    rollout = Rollout(id="r-1", task_id="t1", group_id="g-1", status=RolloutStatus.COMPLETED, tool_calls=calls,
                      reward=1.0)
    tracker = Tracker(MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}}))
    try:
        trace_id = tracker.write_trace(rollout, 0)
    finally:
        tracker.close()
    mlflow.set_tracking_uri(tracker.tracking_uri)
    spans = {s.name: s for s in mlflow.get_trace(trace_id).data.spans}
    assert spans["tool lookup"].attributes["mtrl.source"] == "mcp:notes"
    assert spans["tool double"].attributes["mtrl.source"] == "local"


def test_the_ui_command_the_commands_print_serves_the_run_without_mlflows_job_runner(tmp_path):
    """``ui_command`` (the last line of ``mtrl train``, ``eval`` and ``demo``), run by a shell as a user pastes it,
    answers ``/health`` with one worker and no job runner among its processes."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from mtrl_runtime.tracking import ui_command

    port = free_port()
    command = f"{ui_command(default_tracking_uri(tmp_path / 'run'))} --port {port}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_ENABLE_TELEMETRY": "false"}
    (tmp_path / "run").mkdir()
    proc = subprocess.Popen(["bash", "-c", command], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, f"no /health (exit {proc.poll()})"
                time.sleep(0.3)
        time.sleep(1.0)  # MLflow starts its job runner beside the server, by the time it answers /health
        session = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat[3]) == proc.pid:
                session.append(cmdline)
        assert any("mlflow" in c and "ui" in c for c in session), session
        assert not [c for c in session if "_job_runner" in c or "huey" in c], session
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
