"""The MLflow view of a finished run, checked in a real browser: metric charts and one trajectory trace.

    python scripts/mlflow_view.py RUN_DIR --out docs/img       # a finished run's folder (its mlflow.db)
    python scripts/mlflow_view.py --demo /tmp/demo --out docs/img  # train a small run first, then look

It starts the MLflow UI (``python -m mlflow server`` from this interpreter)
on the run folder's ``mlflow.db``, finds the run, its metrics and a trace
with both model turns and tool calls, and drives headless Chromium (Debian's
``chromium``; ``scripts/setup.sh dev`` installs it where apt-get works):

- ``mlflow_metrics.png``: the run's metric charts (``rollout/reward/mean``...);
- ``mlflow_trace.png``: the trace of one rollout, a span per turn and per tool call;
- ``mlflow_trace.txt``: the trace page's text (``--dump-dom``), for tests.

``--demo`` trains 4 steps on the scripted engine (no model runs; a tiny
random model takes the updates) with a lookup agent that records its tool
calls, so that the pictures need nothing but this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1400,900")


def find_chromium() -> str | None:
    """The path of a Chromium executable, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


# -- a demo run ---------------------------------------------------------------------------------

DEMO_SCRIPT = """\
tasks:
  - match: "key A1"
    replies:
      - tool_call: {name: lookup, arguments: {key: A1}}
      - "ANSWER 42"
  - match: "key B2"
    replies:
      - tool_call: {name: lookup, arguments: {key: B2}}
      - "ANSWER 41"
  - replies: ["ANSWER 0"]
"""
TABLE = {"A1": "42", "B2": "7"}


def _demo_agent() -> Any:
    from mtrl_adapters import aupdate_reward, record_tool_call, rollout

    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "The value stored under a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]

    @rollout
    async def agent(task: Any) -> None:
        import openai

        client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        while True:
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                key = json.loads(call.function.arguments).get("key", "")
                result = TABLE.get(key, "none")
                record_tool_call("lookup", {"key": key}, result=result, call_id=call.id)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        await aupdate_reward(float("ANSWER 42" in (message.content or "")))
        await client.close()

    return agent


def demo_run(run_dir: Path, steps: int = 4) -> Path:
    """Train ``steps`` small steps into ``run_dir`` with MLflow on; returns the run folder."""
    from mtrl_runtime.testing import save_tiny_model
    from mtrl_runtime.training import MultiTurnRLTrainer

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir.parent / f"{run_dir.name}-script.yaml").write_text(DEMO_SCRIPT)
    model = save_tiny_model(run_dir.parent / f"{run_dir.name}-model")
    tasks = [{"id": f"{kind}-{i}", "prompt": f"What is stored under key {key}? ({i})"}
             for i in range(4) for kind, key in (("right", "A1"), ("wrong", "B2"), ("none", "C3"))]
    config = {
        "core": {"engine": "scripted", "model": str(model), "run_dir": str(run_dir), "group_size": 2,
                 "train_batch_size": 3, "max_steps": steps, "max_turns": 4, "lora_rank": 4, "lora_alpha": 8},
        "advanced": {"rollout_timeout_s": 60, "checkpoint_every": 0,
                     "engine_options": {"script_file": str(run_dir.parent / f"{run_dir.name}-script.yaml")},
                     "mlflow": {"experiment_name": "mtrl-demo"}},
    }
    MultiTurnRLTrainer(agent_env=_demo_agent(), training_dataset=tasks, config=config).train(progress=False)
    return run_dir


# -- the MLflow UI ----------------------------------------------------------------------------


SERVING = re.compile(r"Uvicorn running on (?P<url>http://[\d.]+:\d+)")  # mlflow server's uvicorn names its port


def mlflow_db(run_dir: Path) -> Path:
    """The run folder's embedded MLflow store (``RunFolder.mlflow_db``), absolute."""
    from mtrl_runtime.run_folder import RunFolder

    return RunFolder(run_dir).mlflow_db.resolve()


class MlflowUI:
    """``mlflow server`` on a run folder's ``mlflow.db``, on loopback; a context manager."""

    def __init__(self, run_dir: Path, log: Path) -> None:
        self.db = mlflow_db(run_dir)
        if not self.db.is_file():
            raise FileNotFoundError(f"run_dir: {str(run_dir)!r} has no mlflow.db (train it with MLflow on)")
        self.url = ""  # known once the server says which port it took
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "MlflowUI":
        from mtrl_runtime.tracking import VIEWER_ENV

        out = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--host", "127.0.0.1", "--port", "0", "--workers", "1"],  # port 0: a free one
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_ENABLE_TELEMETRY": "false",
                                                        "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
                                                        **VIEWER_ENV},  # no job runner: viewing needs none
        )
        deadline = time.monotonic() + 90
        while True:
            if not self.url and (found := SERVING.search(self.log.read_text(errors="replace"))):
                self.url = found["url"]
            try:
                if self.url:
                    with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                        if r.status == 200:
                            return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"mlflow server did not start; its log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _stop(self.proc)


def _stop(proc: subprocess.Popen) -> None:
    """Terminate ``proc`` if it runs; killed when it has not ended 20 s later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pick(db: Path) -> dict[str, str]:
    """The experiment, the run and a trace that has both model turns and tool calls."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    if not runs:
        raise RuntimeError(f"{db}: holds no MLflow run")
    run = max(runs, key=lambda r: r.info.start_time)
    for trace in client.search_traces(locations=[run.info.experiment_id], max_results=200):
        names = [s.name for s in trace.data.spans]
        if any(n.startswith("tool ") for n in names) and sum(n.startswith("llm turn ") for n in names) >= 2:
            return {"experiment_id": run.info.experiment_id, "run_id": run.info.run_id,
                    "trace_id": trace.info.trace_id, "spans": json.dumps(names)}
    raise RuntimeError(f"{db}: no trace with model turns and tool calls in run {run.info.run_id}")


# -- the browser -----------------------------------------------------------------------------


class Browser:
    """Headless Chromium driven through the DevTools protocol (one page); a context manager.

    ``open(url, until=...)`` loads a page and waits, in real time, until its
    text holds every string of ``until``; ``text()`` is the page's visible
    text; ``screenshot(path)`` writes a PNG of the viewport.
    """

    def __init__(self, executable: str, width: int = 1400, height: int = 900) -> None:
        self.executable, self.width, self.height = executable, width, height
        self._profile = tempfile.TemporaryDirectory(prefix="mtrl-chromium-")
        self._proc: subprocess.Popen | None = None
        self._ws: Any = None
        self._id = 0

    def __enter__(self) -> "Browser":
        from websockets.sync.client import connect

        profile = Path(self._profile.name)
        self._proc = subprocess.Popen(
            [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # its helpers (renderer, GPU, crash handler) share its process group
        deadline = time.monotonic() + 60
        port_file = profile / "DevToolsActivePort"
        while not port_file.is_file() or not port_file.read_text().strip():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self._ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=20)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=60))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"chromium {method}: {message['error']}")
                return message.get("result", {})

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def open(self, url: str, until: tuple[str, ...] = (), timeout_s: float = 90) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for(until, timeout_s)

    def wait_for(self, strings: tuple[str, ...], timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if all(s in text for s in strings):
                return
            if time.monotonic() > deadline:
                missing = [s for s in strings if s not in text]
                raise TimeoutError(f"the page never showed {missing!r}; it shows:\n{text[:3000]}")
            time.sleep(0.5)

    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path, width: int | None = None) -> None:
        """A PNG of the viewport's left ``width`` pixels (all of it by default)."""
        import base64

        clip = {"x": 0, "y": 0, "width": width or self.width, "height": self.height, "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", clip=clip)["data"]
        path.write_bytes(base64.b64decode(data))

    def __exit__(self, *exc: object) -> None:
        if self._ws is not None:
            self._ws.close()
        if self._proc is not None:
            _stop(self._proc)
            # helpers outliving the browser still write into the profile; removing it under them failed
            # with "Directory not empty" (seen once in a full suite run)
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # safe: no helper is left in the group (all ended with the browser), so nothing to kill
        for attempt in range(20):  # a killed helper's last writes land as it exits
            try:
                self._profile.cleanup()
                return
            except OSError:
                if attempt == 19:
                    raise
                time.sleep(0.1)


ASSISTANT_PANEL_PX = 370  # MLflow's assistant side panel on the right of every page: left out of the pictures
# Type into the metric search box the way React listens for it.
SEARCH_METRICS = """
((query) => {
  const box = document.querySelector('input[placeholder*="Search metric"]');
  if (!box) return false;
  const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
  set.call(box, query);
  box.dispatchEvent(new Event('input', {bubbles: true}));
  return true;
})
"""


def metrics_url(base: str, ids: dict[str, str]) -> str:
    return f"{base}/#/experiments/{ids['experiment_id']}/runs/{ids['run_id']}/model-metrics"


def trace_url(base: str, ids: dict[str, str]) -> str:
    return f"{base}/#/experiments/{ids['experiment_id']}/traces?selectedEvaluationId={ids['trace_id']}"


def capture(run_dir: Path, out: Path, browser: str, metric_filter: str = "rollout/reward/") -> dict[str, Any]:
    """Screenshots of the run's metric charts and of one trace, and the trace page's text, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    ids = pick(mlflow_db(run_dir))
    spans = json.loads(ids["spans"])
    with MlflowUI(run_dir, out / "mlflow_server.log") as ui, Browser(browser) as page:
        shown = page.width - ASSISTANT_PANEL_PX
        page.open(metrics_url(ui.url, ids), until=("Model metrics",))
        page.js(f"{SEARCH_METRICS}({json.dumps(metric_filter)})")
        page.wait_for((f"run ({metric_filter}mean)",))  # a chart's legend: the chart is drawn
        time.sleep(1)
        page.screenshot(out / "mlflow_metrics.png", shown)
        page.open(trace_url(ui.url, ids), until=tuple(spans))
        time.sleep(1)
        text = page.text()
        page.screenshot(out / "mlflow_trace.png", shown)
    (out / "mlflow_trace.txt").write_text(text, encoding="utf-8")
    return {**ids, "metrics_png": str(out / "mlflow_metrics.png"), "trace_png": str(out / "mlflow_trace.png"),
            "trace_text": str(out / "mlflow_trace.txt")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", type=Path, help="a finished run's folder (holding mlflow.db)")
    parser.add_argument("--demo", type=Path, metavar="RUN_DIR", help="train a small demo run here first")
    parser.add_argument("--out", type=Path, required=True, help="where the PNGs and the trace text go")
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.demo is None):
        parser.error("give a RUN_DIR or --demo RUN_DIR (one of them)")
    browser = find_chromium()
    if browser is None:
        raise SystemExit("chromium: not found; install it (Debian: apt-get install -y chromium, "
                         "or scripts/setup.sh dev)")
    run_dir = demo_run(args.demo) if args.demo is not None else args.run_dir
    print(json.dumps(capture(run_dir, args.out, browser), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
