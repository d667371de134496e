"""The pytest-xdist groups of the suite (``pytest -n 3``; ``--dist loadgroup`` is in pyproject's addopts).

The tests of one group run one after another, in collection order, on one
worker; a test in no group may run on any worker.

- ``PROCESSES``: tests that start multi-process jobs: local Ray clusters
  (``ray.init``, ``ray start`` nodes), ``torchrun`` jobs of two ranks (the
  FSDP tests and the docs page that launches one). Two of them at once on
  2 cores starve each other's startup (a Ray node's registration, a gloo
  rendezvous), so they never run beside each other.
- each docs page (``tests/test_docs.py``): its blocks read what the blocks
  above them wrote, so a page runs in order in one workspace; pages whose
  servers listen on the same fixed port share one group.
- ``EXTRAS`` (``tests/test_extras.py``): its resolutions against PyPI run
  at once in one module fixture, so its tests stay on the worker that ran it.
- ``one_worker(module)``: a module whose module-scoped fixtures cost seconds
  of CPU to build (a trained run, a served coordinator and its parsed
  OpenAPI schema, a converted tokenizer, a migrated MLflow store). Dealt one
  by one, its tests reached every worker, and each worker built them again;
  as one group they are built once.
"""

from __future__ import annotations

import pytest

PROCESSES = "processes"
EXTRAS = "extras"

processes = pytest.mark.xdist_group(PROCESSES)


def one_worker(module: str) -> pytest.MarkDecorator:
    """The ``xdist_group`` of a module whose tests share fixtures that are costly to build (module docstring)."""
    return pytest.mark.xdist_group(f"module-{module}")
