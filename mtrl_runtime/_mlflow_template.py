"""A new run's embedded MLflow store, copied from an already migrated empty one.

MLflow creates a SQLite tracking store by building its first tables and then
running every schema migration (about 1.7 s of CPU on a 2-core machine), and
every new run folder paid that. ``prepare_store(db)`` instead copies a
template kept in mtrl's cache when ``db`` does not exist yet:
``$MTRL_CACHE/mlflow/empty-store-<key>.db`` (default ``~/.cache/mtrl``),
``<key>`` naming the MLflow, SQLAlchemy and alembic versions and MLflow's
schema head revision, so another install or a changed schema is another file.

The template is made by MLflow's own code, the first half of what
``SqlAlchemyStore`` does to an empty database (its engine, ``_initialize_tables``:
the initial tables and every migration), and holds no experiment: MLflow adds
its default experiment when it first opens the copy, exactly as it does for a
store it made itself (that row names an artifact location taken from where
the store is opened, so it cannot be in a shared file). It is built once per
key into a temporary file beside it and renamed into place, so processes that
build it at once each finish with a whole file.

Before each copy the template is checked: it opens as SQLite, passes
``quick_check``, its ``alembic_version`` is the head, and it holds every
table MLflow's models name. A template that fails (corrupt, locked, stale) is
logged with the reason and built again; when that fails too (say, the cache
folder is not writable) the reason is logged and MLflow creates the store
itself. The copy lands with a hard link, so a store another process created
meanwhile is never overwritten.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from .cache import mtrl_cache_root

log = logging.getLogger("mtrl.tracking")

TEMPLATE_FOLDER = "mlflow"


def template_cache_dir() -> Path:
    """Where migrated empty MLflow stores are kept: ``$MTRL_CACHE/mlflow``, else ``~/.cache/mtrl/mlflow``."""
    return mtrl_cache_root() / TEMPLATE_FOLDER


def schema_head() -> str:
    """The alembic revision MLflow's migrations end at (what it checks a store against when opening it)."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def template_key(head: str | None = None) -> str:
    """The installed MLflow, SQLAlchemy and alembic versions and the schema head: one template per key."""
    import alembic
    import mlflow
    import sqlalchemy

    return f"mlflow{mlflow.__version__}-sqlalchemy{sqlalchemy.__version__}-alembic{alembic.__version__}-{head or schema_head()}"


def template_path(cache_dir: Path | None = None, head: str | None = None) -> Path:
    """The template file of this install: ``<cache>/empty-store-<key>.db``."""
    return Path(cache_dir or template_cache_dir()) / f"empty-store-{template_key(head)}.db"


def prepare_store(db: str | Path, cache_dir: Path | None = None) -> str:
    """Make ``db`` a copy of the migrated empty template unless it exists; says how: ``exists``, ``template``, ``mlflow``.

    ``mlflow`` means nothing was copied (the reason is logged) and MLflow
    creates the store itself when it first opens it.
    """
    db = Path(db)
    if db.exists():
        return "exists"
    try:
        head = schema_head()
        template = template_path(cache_dir, head)
    except Exception as exc:  # an MLflow without these internals: it creates its stores itself
        log.warning("MLflow store template: cannot name it (%s: %s); MLflow creates %s itself",
                    type(exc).__name__, exc, db)
        return "mlflow"
    problem = template_problem(template, head) if template.exists() else None
    if problem is not None:
        log.warning("MLflow store template %s not used: %s; building it again", template, problem)
    if problem is not None or not template.exists():
        try:
            build_template(template)
        except Exception as exc:
            log.warning("MLflow store template %s could not be built (%s: %s); MLflow creates %s itself",
                        template, type(exc).__name__, exc, db)
            return "mlflow"
        problem = template_problem(template, head)
        if problem is not None:
            log.warning("MLflow store template %s just built is not usable: %s; MLflow creates %s itself",
                        template, problem, db)
            return "mlflow"
    try:
        _copy_new(template, db)
    except FileExistsError:
        return "exists"  # another process created the store meanwhile
    except OSError as exc:
        log.warning("MLflow store template %s could not be copied to %s (%s); MLflow creates it itself",
                    template, db, exc)
        return "mlflow"
    return "template"


def template_problem(template: Path, head: str) -> str | None:
    """Why ``template`` cannot stand for a new store (unreadable, corrupt, another schema, tables missing), or None."""
    try:
        con = sqlite3.connect(f"{template.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error as exc:
        return f"it does not open as SQLite ({exc})"
    try:
        check = con.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            return f"SQLite's quick_check reports {check[0] if check else 'nothing'!r}"
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "alembic_version" not in tables:
            return "it has no alembic_version table"
        revisions = [row[0] for row in con.execute("SELECT version_num FROM alembic_version")]
        if revisions != [head]:
            return f"its schema revision is {revisions}, MLflow's head is {head!r}"
        missing = sorted(_mlflow_tables() - tables)
        if missing:
            return f"it lacks MLflow's tables {missing}"
        if con.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]:
            return "it holds experiments (a template is empty)"
    except sqlite3.Error as exc:  # not a database, locked, truncated
        return f"SQLite cannot read it ({exc})"
    finally:
        con.close()
    return None


def build_template(template: Path) -> None:
    """Build the migrated empty store with MLflow's own code into a temporary file, then rename it to ``template``."""
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry

    template.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{template.name}.", suffix=".tmp", dir=template.parent)
    os.close(fd)
    os.unlink(tmp)  # SQLite creates the file itself
    try:
        engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(tmp, template)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _copy_new(template: Path, db: Path) -> None:
    """Copy ``template`` to ``db`` whole or not at all; FileExistsError when ``db`` appeared meanwhile."""
    db.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{db.name}.", suffix=".tmp", dir=db.parent)
    os.close(fd)
    try:
        shutil.copyfile(template, tmp)
        os.link(tmp, db)  # fails when db exists: never overwrites a store
    finally:
        os.unlink(tmp)


def _mlflow_tables() -> set[str]:
    """The tables MLflow's models name (what MLflow checks to decide a store needs no creating)."""
    from mlflow.store.db.utils import Base  # that module imports every model, filling Base's tables

    return set(Base.metadata.tables)


__all__ = ["prepare_store", "schema_head", "template_cache_dir", "template_key", "template_path", "template_problem"]
