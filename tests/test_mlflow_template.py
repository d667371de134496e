"""A new run's MLflow store copied from a migrated empty template: what MLflow would create, read back by MLflow.

Real MLflow and SQLite in temp dirs; the template cache is a temp ``$MTRL_CACHE``.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtrl_runtime._mlflow_template import prepare_store, schema_head, template_key, template_path
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.run_folder import RunFolder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MTRL_CACHE", str(folder))
    return folder / "mlflow"


def _open(db: Path):
    """Open ``db`` the way a Tracker does (an MlflowClient on its URI), touching the store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    client.search_experiments()
    return client


def _schema(db: Path) -> list[tuple]:
    """Every table, index and trigger: its columns in order and its SQL's clauses.

    The clauses are compared as a set: MLflow itself writes a table's named CHECK constraints in an
    order that changes with ``PYTHONHASHSEED`` (the ``runs`` table's two, in 3.17), so two stores it
    creates in two processes differ in that order alone.
    """
    with sqlite3.connect(db) as con:
        entries = con.execute("SELECT type, name, COALESCE(sql, '') FROM sqlite_master").fetchall()
        return sorted((kind, name, con.execute(f'PRAGMA table_info("{name}")').fetchall() if kind == "table" else [],
                       sorted(line.strip().rstrip(",") for line in sql.splitlines())) for kind, name, sql in entries)


def _rows(db: Path) -> dict[str, list[tuple]]:
    """Every table's rows, the default experiment's clock fields left out (they are when it was made)."""
    with sqlite3.connect(db) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"').fetchall())) for t in tables if t != "experiments"}
        out["experiments"] = con.execute(
            "SELECT experiment_id, name, artifact_location, lifecycle_stage, workspace FROM experiments").fetchall()
    return out


def test_a_templated_store_is_what_mlflow_creates_and_opens_without_migrating(tmp_path, cache, monkeypatch):
    import mlflow.store.db.utils as db_utils

    fresh = tmp_path / "fresh" / "mlflow.db"
    fresh.parent.mkdir()
    _open(fresh)  # MLflow's own creation
    assert prepare_store(tmp_path / "first" / "mlflow.db") == "template"  # builds the template, then copies it
    assert template_path().is_file() and template_path().parent == cache

    migrations = []
    real = db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables", lambda engine: (migrations.append(engine), real(engine)))
    copied = tmp_path / "copied" / "mlflow.db"
    assert prepare_store(copied) == "template"
    _open(copied)
    assert migrations == []  # MLflow found every table at the head revision: nothing created, nothing migrated
    with sqlite3.connect(copied) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(schema_head(),)]
        assert con.execute("SELECT experiment_id, name FROM experiments").fetchall() == [(0, "Default")]
    assert _schema(copied) == _schema(fresh)
    assert _rows(copied) == _rows(fresh)
    assert prepare_store(copied) == "exists"  # an existing store (a resumed run's) is left alone


def test_a_run_logs_params_metrics_and_traces_into_a_templated_store(tmp_path, cache):
    import mlflow

    from mtrl_runtime.tracking import Tracker
    from mtrl_runtime.types import Rollout, RolloutStatus, ToolCall

    prepare_store(tmp_path / "warm" / "mlflow.db")  # the template exists: the run's store is a copy
    run_dir = tmp_path / "run"
    calls = (ToolCall("r-1", "lookup", {"key": "A1"}, call_id="c1", result="42", turn_index=0, started_at=1.0,
                      latency_s=0.1),)
    rollout = Rollout(id="r-1", task_id="t1", group_id="g-1", status=RolloutStatus.COMPLETED, tool_calls=calls,
                      reward=1.0)
    tracker = Tracker(MtrlConfig.from_dict({"core": {"run_dir": str(run_dir), "group_size": 4}}))
    try:
        tracker.log_metrics(0, {"rollout/reward/mean": 0.5})
        tracker.log_metrics(1, {"rollout/reward/mean": 0.75})
        trace_id = tracker.write_trace(rollout, 1)
    finally:
        tracker.close()
    assert tracker.tracking_uri == RunFolder(run_dir).mlflow_uri

    mlflow.set_tracking_uri(tracker.tracking_uri)
    runs = mlflow.search_runs(experiment_ids=[tracker.experiment_id], output_format="list")
    assert [r.info.run_id for r in runs] == [tracker.run_id]
    assert runs[0].data.params["core.group_size"] == "4"
    history = mlflow.MlflowClient().get_metric_history(tracker.run_id, "rollout/reward/mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 0.75)]
    trace = mlflow.get_trace(trace_id)
    assert trace.info.tags["mtrl.rollout_id"] == "r-1"
    assert "tool lookup" in {s.name for s in trace.data.spans}

    # the store the MLflow UI serves reads the same run (the UI's server builds its store from the URI)
    from mlflow.server.handlers import _get_tracking_store

    store = _get_tracking_store(tracker.tracking_uri, str(run_dir / "mlartifacts"))
    assert [r.info.run_id for r in store.search_runs([tracker.experiment_id], "", 1)] == [tracker.run_id]
    assert {e.name for e in store.search_experiments()} == {"Default", tracker.client.get_experiment(
        tracker.experiment_id).name}


def test_two_processes_creating_stores_at_once_both_get_whole_ones(tmp_path, cache):
    script = textwrap.dedent("""
        import sys
        from mtrl_runtime._mlflow_template import prepare_store
        print(prepare_store(sys.argv[1]))
    """)
    dbs = [tmp_path / f"run{i}" / "mlflow.db" for i in range(2)] + [tmp_path / "same" / "mlflow.db"] * 2
    procs = [subprocess.Popen([sys.executable, "-c", script, str(db)], stdout=subprocess.PIPE, text=True)
             for db in dbs]
    answers = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert answers[:2] == ["template", "template"]
    assert sorted(answers[2:]) == ["exists", "template"]  # one copy lands in the shared folder, the other finds it
    assert [p.name for p in cache.iterdir()] == [template_path().name]  # one template, no temporary file left
    for db in dbs[1:3]:
        assert _open(db).get_experiment("0").name == "Default"
        assert [p.name for p in db.parent.iterdir()] == ["mlflow.db"]


def test_a_template_of_another_key_is_not_used(tmp_path, cache):
    prepare_store(tmp_path / "warm" / "mlflow.db")
    ours = template_path()
    other = cache / ours.name.replace(template_key(), "mlflow0.0.1-sqlalchemy0-alembic0-0000")
    shutil.copyfile(ours, other)
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE marker (x)")  # what would show if this file were copied
    ours.unlink()

    db = tmp_path / "run" / "mlflow.db"
    assert prepare_store(db) == "template"
    assert ours.is_file()  # built again for this install's key
    with sqlite3.connect(db) as con:
        assert "marker" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}


def test_a_stale_template_under_our_key_is_rebuilt_with_a_logged_reason(tmp_path, cache, caplog):
    prepare_store(tmp_path / "warm" / "mlflow.db")
    with sqlite3.connect(template_path()) as con:
        con.execute("UPDATE alembic_version SET version_num = 'feedbeef0000'")
    db = tmp_path / "run" / "mlflow.db"
    with caplog.at_level(logging.WARNING, logger="mtrl.tracking"):
        assert prepare_store(db) == "template"
    assert "its schema revision is ['feedbeef0000']" in caplog.text and schema_head() in caplog.text
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(schema_head(),)]
    assert _open(db).get_experiment("0").name == "Default"


def test_a_corrupt_template_falls_back_with_a_logged_reason(tmp_path, cache, caplog):
    prepare_store(tmp_path / "warm" / "mlflow.db")
    template_path().write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)  # a header and then garbage
    db = tmp_path / "run" / "mlflow.db"
    with caplog.at_level(logging.WARNING, logger="mtrl.tracking"):
        assert prepare_store(db) == "template"
    assert f"MLflow store template {template_path()} not used" in caplog.text
    assert "SQLite cannot read it" in caplog.text or "quick_check" in caplog.text
    assert _open(db).get_experiment("0").name == "Default"


def test_an_unwritable_cache_leaves_the_store_to_mlflow_with_a_logged_reason(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("MTRL_CACHE", str(blocker))
    db = tmp_path / "run" / "mlflow.db"
    with caplog.at_level(logging.WARNING, logger="mtrl.tracking"):
        assert prepare_store(db) == "mlflow"
    assert "could not be built" in caplog.text and f"MLflow creates {db} itself" in caplog.text
    assert not db.exists()
    db.parent.mkdir()
    assert _open(db).get_experiment("0").name == "Default"  # MLflow made it, as before templates
