"""MLflow for a training run: params, per-step metrics, artifacts, and one trace per trajectory.

Embedded by default: a SQLite tracking store inside the run folder
(``sqlite:///<run_dir>/mlflow.db``) with artifacts beside it
(``<run_dir>/mlartifacts``), so a run needs no server; a new one is a copy
of a migrated empty store cached per MLflow version (``_mlflow_template``),
not migrated again; open it with ``ui_command(uri)``
(``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db --workers 1``
without MLflow's job runner). Any other
tracking URI (``advanced.mlflow.tracking_uri``) is used as given.

Each trajectory becomes one trace: a root span for the rollout (inputs: the
task; outputs: reward and status), a child span per LLM call (the request's
messages and tool definitions in, the completion text and tool calls out) and one per tool call
(arguments in, result or error out), with the times the store recorded,
and a span per non-policy model call (``non-policy <protocol> <model>``,
attribute ``mtrl.policy`` false: its tokens, latency and error).
A context compaction shows as its boundary: the summary call's span is
``llm turn N (compaction summary)``, a ``compaction`` span sits where the
episode went on (tokens before and after, the summary's tokens), the
compacted turn's span carries ``mtrl.break_reason`` ``compacted``, and the
trace is tagged ``mtrl.compactions`` with the episode's figures in its
outputs (``algorithms.compaction``).
Traces are tagged ``mtrl.rollout_id``, ``mtrl.group_id``, ``mtrl.step`` and
``mtrl.reward``, and ``mtrl.chat_format`` when the Tracker is given the
endpoint's chat format (a warm start parses each reply's text back with it).
Token ids and logprobs never go to MLflow. A run with roles (``roles``)
logs each role's step figures under ``role/<role>/`` (its reward, turns,
advantages, samples and update), each role's own reward per rollout as
``role_reward/<role>``, and names each LLM span's role (attribute ``mtrl.role``).

Traces are written by one background thread so the training loop never
waits on them; ``flush()`` waits until every queued trace is written.
MLflow's tracer exports spans to the process-wide tracking URI, so a
Tracker sets that URI (and resets the tracer) while it is open and restores
the previous one on ``close()``: one tracked run per process at a time.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from ._mlflow_template import prepare_store
from .algorithms import episode_tokens
from .config import MtrlConfig
from .run_folder import RunFolder
from .types import BreakReason, ModelCall, Rollout, ToolCall, Turn

log = logging.getLogger("mtrl.tracking")

_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")
_MAX_PARAM_CHARS = 6000
_SECRET_KEY = re.compile(r"(^|_)(api_?key|secret|password|token)$", re.IGNORECASE)  # not max_tokens


def default_tracking_uri(run_dir: str | Path) -> str:
    """The embedded store of a run: a SQLite file inside its folder (``RunFolder.mlflow_uri``)."""
    return RunFolder(run_dir).mlflow_uri


# The MLflow UI's environment for viewing runs: none of MLflow's server-side jobs (its job runner and consumers cost
# 45 s of CPU in the UI's first 30 s on 2 cores, bench/mlflow_ui_cpu.py).
VIEWER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def ui_command(tracking_uri: str) -> str:
    """The shell command that opens ``tracking_uri`` in the MLflow UI for one viewer: one worker process and
    ``VIEWER_ENV``. What ``mtrl train``, ``eval`` and ``demo`` print at their end."""
    env = " ".join(f"{name}={value}" for name, value in VIEWER_ENV.items())
    return f"{env} mlflow ui --backend-store-uri {tracking_uri} --workers 1"


def flatten_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config dict as MLflow params: dotted keys, string values (lists JSON-like).

    Credentials (``api_key``, ``token``, ``secret``, ``password`` keys) are
    logged as ``<redacted>``: MLflow is shared and never holds a secret.
    """
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, name + "."))
        elif value is not None and _SECRET_KEY.search(str(key)):
            out[name] = "<redacted>"
        else:
            out[name] = str(value)[:_MAX_PARAM_CHARS]
    return out


def metric_key(name: str) -> str:
    """``name`` with characters MLflow refuses in a metric key replaced by ``_``."""
    return _BAD_KEY_CHARS.sub("_", name) or "_"


class Tracker:
    """One MLflow run of a training run: metrics and params now, traces in the background (a ``RunTracker``).

    ``run_id`` continues an existing MLflow run (resume); otherwise a new run
    is created in ``experiment_name`` and its params are the flattened config.
    """

    def __init__(self, config: MtrlConfig, run_id: str | None = None, run_name: str | None = None,
                 chat_format: str | None = None) -> None:
        from mlflow import MlflowClient

        settings = config.advanced.mlflow
        self.run_dir = config.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if settings.tracking_uri is None:  # a new embedded store is copied from a migrated one (_mlflow_template)
            prepare_store(RunFolder(self.run_dir).mlflow_db)
        self.tracking_uri = settings.tracking_uri or default_tracking_uri(self.run_dir)
        self.log_traces = settings.log_traces
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self._previous_uri = _route_traces(self.tracking_uri)
        self.experiment_id = self._experiment(settings.experiment_name, embedded=settings.tracking_uri is None)
        if run_id is None:
            run = self.client.create_run(self.experiment_id, run_name=run_name or self.run_dir.name)
            self.run_id = run.info.run_id
            self.log_params(flatten_params(config.recorded()))
        else:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        self.chat_format = chat_format  # the endpoint's chat format: a trace's reply text parses back with it
        self.train_summary = config.advanced.summary_turns == "train"
        self.trace_failures = 0
        self._traces: queue.Queue[tuple[Rollout, int] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._write_traces, name="mtrl-mlflow-traces", daemon=True)
        self._worker.start()
        self._closed = False

    def _experiment(self, name: str, embedded: bool) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = RunFolder(self.run_dir).mlflow_artifacts.resolve().as_uri() if embedded else None
        return self.client.create_experiment(name, artifact_location=location)

    # ---- params, metrics, artifacts ------------------------------------------

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Every metric of ``step`` in one batch (keys made MLflow-safe)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(metric_key(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def log_artifacts(self, folder: str | Path, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def set_tag(self, key: str, value: str) -> None:
        """A tag on the MLflow run (e.g. ``mtrl.diagnosis.<rule>``; MLflow caps a value at 5000 characters)."""
        self.client.set_tag(self.run_id, key, value)

    # ---- traces ---------------------------------------------------------------

    def log_rollouts(self, rollouts: Iterable[Rollout], step: int) -> None:
        """Queue one trace per rollout (rollouts need their turns and tool calls)."""
        if not self.log_traces:
            return
        for rollout in rollouts:
            self._traces.put((rollout, step))

    def flush(self) -> None:
        """Block until every queued trace is written."""
        import mlflow

        self._traces.join()
        mlflow.flush_trace_async_logging()

    def _write_traces(self) -> None:
        while True:
            item = self._traces.get()
            try:
                if item is None:
                    return
                self.write_trace(*item)
            except Exception as exc:  # tracing must never stop training
                self.trace_failures += 1
                if self.trace_failures == 1:
                    log.warning("mtrl: writing an MLflow trace failed (%s: %s); training goes on", type(exc).__name__, exc)
            finally:
                self._traces.task_done()

    def write_trace(self, rollout: Rollout, step: int) -> str:
        """Write one rollout as one trace now; returns the trace id."""
        start_ns = _ns(rollout.created_at)
        end_ns = _ns(rollout.finished_at or _last_time(rollout))
        root = self.client.start_trace(
            f"rollout {rollout.task_id}",
            span_type="AGENT",
            inputs={"task_id": rollout.task_id, "messages": _first_messages(rollout)},
            tags=_trace_tags(rollout, step, self.chat_format),
            experiment_id=self.experiment_id,
            start_time_ns=start_ns,
            run_id=self.run_id,
        )
        trace_id = root.trace_id
        summaries = rollout.summary_turns
        figures = episode_tokens(rollout, self.train_summary)
        for turn in sorted(rollout.turns, key=lambda t: t.index):
            summary = turn.index in summaries
            name = f"llm turn {turn.index}" + (" (compaction summary)" if summary else "")
            inputs, outputs, attributes = _turn_io(turn)
            if summary:
                attributes["mtrl.compaction_summary"] = True
                attributes["mtrl.trained"] = self.train_summary
            if turn.break_reason is BreakReason.COMPACTED:
                k = sum(t.break_reason is BreakReason.COMPACTED and t.index < turn.index for t in rollout.turns)
                boundary = {"tokens_before": figures.tokens_before[k], "tokens_after": figures.tokens_after[k],
                            "summary_tokens": figures.summary_tokens[k], "summary_turn": turn.index - 1,
                            "segment": turn.segment}
                self._span(trace_id, root.span_id, "compaction", "CHAIN", {"summary_turn": turn.index - 1},
                           boundary, {"mtrl.compaction": k}, turn.started_at, 0.0, "OK")
            self._span(trace_id, root.span_id, name, "CHAT_MODEL", inputs, outputs, attributes,
                       turn.started_at, turn.latency_s, "OK")
        for call in rollout.tool_calls:
            status = "OK" if call.status == "success" and call.error is None else "ERROR"
            self._span(trace_id, root.span_id, f"tool {call.name}", "TOOL",
                       *_tool_io(call), call.started_at, call.latency_s, status)
        for model_call in rollout.model_calls:  # a judge, a planner: passed through, not the policy's, never trained
            self._span(trace_id, root.span_id, f"non-policy {model_call.protocol} {model_call.model}", "LLM",
                       *_model_call_io(model_call), model_call.started_at, model_call.latency_s,
                       "OK" if model_call.status == "success" else "ERROR")
        outputs = {"reward": rollout.total_reward, "turn_rewards": rollout.turn_rewards,
                   "status": rollout.status.value, "error": rollout.error, "metrics": dict(rollout.metrics)}
        if figures.compactions:
            outputs["episode"] = figures.to_metrics()
        self.client.end_trace(trace_id, outputs=outputs, status="OK" if rollout.status.value == "completed" else "ERROR",
                              end_time_ns=max(end_ns, start_ns))
        return trace_id

    def _span(self, trace_id: str, parent_id: str, name: str, kind: str, inputs: Any, outputs: Any,
              attributes: dict[str, Any], started_at: float, latency_s: float, status: str) -> None:
        start_ns = _ns(started_at)
        span = self.client.start_span(name, trace_id=trace_id, parent_id=parent_id, span_type=kind,
                                      inputs=inputs, attributes=attributes, start_time_ns=start_ns)
        self.client.end_span(trace_id, span.span_id, outputs=outputs, status=status,
                             end_time_ns=start_ns + int(max(latency_s, 0.0) * 1e9))

    # ---- lifecycle ------------------------------------------------------------

    def close(self, status: str = "FINISHED") -> None:
        """Write the queued traces and end the MLflow run. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._traces.put(None)
        self._worker.join()
        try:
            self.flush()
            self.client.set_terminated(self.run_id, status=status)
        finally:
            _route_traces(self._previous_uri)


class NullTracker:
    """A ``RunTracker`` that records nothing: a run with tracking off (``tracking=False``, ``--no-mlflow``)."""

    run_id: str | None = None
    tracking_uri: str | None = None

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_rollouts(self, rollouts: Iterable[Rollout], step: int) -> None:
        pass

    def log_artifacts(self, folder: str | Path, artifact_path: str) -> None:
        pass

    def set_tag(self, key: str, value: str) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        pass


def _route_traces(uri: str | None) -> str | None:
    """Point MLflow's (process-wide) tracer at ``uri``; returns the URI it pointed at before."""
    import mlflow

    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    mlflow.tracing.reset()
    return previous


def _ns(seconds: float) -> int:
    return int((seconds or time.time()) * 1e9)


def _last_time(rollout: Rollout) -> float:
    ends = [t.started_at + t.latency_s for t in rollout.turns] + [c.started_at + c.latency_s for c in rollout.tool_calls]
    return max(ends, default=rollout.created_at)


def _first_messages(rollout: Rollout) -> list[Any]:
    turns = sorted(rollout.turns, key=lambda t: t.index)
    return list(turns[0].messages) if turns else []


def _trace_tags(rollout: Rollout, step: int, chat_format: str | None = None) -> dict[str, str]:
    tags = {
        "mtrl.rollout_id": rollout.id,
        "mtrl.group_id": rollout.group_id,
        "mtrl.task_id": rollout.task_id,
        "mtrl.step": str(step),
        "mtrl.reward": f"{rollout.total_reward:.6g}",
        "mtrl.status": rollout.status.value,
        "mtrl.policy_version": str(rollout.policy_version),
    }
    if chat_format:  # warm start reads a turn's reply back from its text with this format (warmstart._mlflow_traces)
        tags["mtrl.chat_format"] = chat_format
    compactions = sum(t.break_reason is BreakReason.COMPACTED for t in rollout.turns)
    if compactions:  # the episode compacted its context: one episode over several segments
        tags["mtrl.compactions"] = str(compactions)
    if rollout.reward_defaulted:  # the agent reported none: mtrl.reward is the default, no demonstration
        tags["mtrl.reward_defaulted"] = "true"
    wires = sorted(k.split("/", 1)[1] for k in rollout.metrics if k.startswith("tripwire/"))
    if wires:  # advanced.tripwires: which wires it tripped (the evidence: <run_dir>/tripwires.jsonl)
        tags["mtrl.tripwires"] = ",".join(wires)
        if "agent_reward" in rollout.metrics:
            tags["mtrl.agent_reward"] = f"{rollout.metrics['agent_reward']:.6g}"
    return tags


def _turn_io(turn: Turn) -> tuple[Any, Any, dict[str, Any]]:
    """An LLM span's inputs, outputs and attributes: messages and text, never token ids."""
    inputs = {"messages": list(turn.messages), "tools": list(turn.tools)}  # whole definitions: they are in the prompt
    outputs = {"content": turn.completion_text, "tool_calls": list(turn.tool_calls), "finish_reason": turn.finish_reason}
    attributes = {
        "mtrl.policy_version": turn.policy_version,
        "mtrl.segment": turn.segment,
        "mtrl.prompt_tokens": len(turn.prompt_ids),
        "mtrl.completion_tokens": len(turn.completion_ids),
        "mtrl.malformed_tool_call": turn.malformed_tool_call,
    }
    if turn.break_reason is not None:
        attributes["mtrl.break_reason"] = turn.break_reason.value
    if turn.model is not None:  # a reference model's turn (an evaluation's reference side): no token ids
        attributes["mtrl.model"] = turn.model
    if turn.role is not None:  # a run with roles: the role whose adapter wrote it (``roles``)
        attributes["mtrl.role"] = turn.role
    return inputs, outputs, attributes


def _tool_io(call: ToolCall) -> tuple[Any, Any, dict[str, Any]]:
    outputs = {"result": call.result} if call.error is None else {"error": call.error, "result": call.result}
    attributes = {"mtrl.call_id": call.call_id or "", "mtrl.turn_index": -1 if call.turn_index is None else call.turn_index,
                  "mtrl.source": call.source or "local"}  # "mcp:<server>" for a tool an MCP server served
    return {"name": call.name, "arguments": call.arguments}, outputs, attributes


def _model_call_io(call: ModelCall) -> tuple[Any, Any, dict[str, Any]]:
    outputs = {"input_tokens": call.input_tokens, "output_tokens": call.output_tokens, "error": call.error}
    attributes = {"mtrl.policy": False, "mtrl.protocol": call.protocol, "mtrl.stream": call.stream}
    return {"model": call.model}, outputs, attributes


__all__ = ["NullTracker", "Tracker", "default_tracking_uri", "flatten_params", "metric_key"]
