"""The MLflow view of a finished run, in a real browser (headless Chromium through the DevTools protocol).

``scripts/mlflow_view.py`` trains a small demo run (scripted engine, an
agent that looks a key up), starts the MLflow UI on the run's
``mlflow.db`` and takes two screenshots; the trace page must show the
rollout's turns and its tool call as spans. Skipped, saying why, where
Chromium is not installed (``scripts/setup.sh dev`` installs it where
apt-get works).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import mlflow_view  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(mlflow_view.find_chromium() is None,
                       reason="chromium is not installed (apt-get install -y chromium, or scripts/setup.sh dev)"),
]


@pytest.mark.timeout(420)
def test_the_trace_page_shows_the_rollouts_turns_and_tool_calls(tmp_path):
    pytest.importorskip("websockets.sync.client", reason="the DevTools client needs the websockets package")
    run = mlflow_view.demo_run(tmp_path / "run", steps=2)  # one step draws no line chart
    found = mlflow_view.capture(run, tmp_path / "out", mlflow_view.find_chromium())

    spans = json.loads(found["spans"])
    assert spans[0].startswith(("rollout right-", "rollout wrong-")), spans  # the tasks the script looks up
    assert spans[1:] == ["llm turn 0", "tool lookup", "llm turn 1"], spans
    text = Path(found["trace_text"]).read_text()
    lines = text.splitlines()
    for name in spans:  # the span tree, as the page shows it
        assert name in lines, f"{name!r} not on the trace page:\n{text[:2000]}"
    kind, index = spans[0].removeprefix("rollout ").split("-")
    key = {"right": "A1", "wrong": "B2"}[kind]
    assert f"What is stored under key {key}? ({index})" in text  # the rollout's first message
    assert "completed" in lines
    for png in (found["metrics_png"], found["trace_png"]):
        data = Path(png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, png
