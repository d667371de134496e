"""The suite's ``xdist_group`` marks honoured under pytest 9.2 (``--dist loadgroup``; see tests/_groups.py).

pytest-xdist 3.8 tells its controller a test's group by appending ``@group``
to the test's node id on the worker (``item._nodeid``). pytest 9.2 keeps a
node's id in ``Node._id``, so the suffix is lost without an error and every
test is scheduled on its own: a docs page's blocks ran on two workers and
found what the page's earlier blocks wrote missing (pytest-xdist issue
#1386, open; PR #1388). This plugin carries the groups another way: each
worker writes the ``{node id: group}`` of the tests it collected with an
``xdist_group`` mark into a folder the controller names in its
``workerinput``, and the controller's scheduler (``GroupScheduling``, xdist's
``LoadGroupScheduling``) reads them. A worker that wrote nothing is an error,
never a silent loss of the groups; ids that do carry xdist's suffix (an
older pytest, a fixed xdist) are scheduled by it as before.

The scheduler also starts the longest work first. xdist's own order is the
scopes' test counts, largest first (a docs page, the ``processes`` group),
then each test in no group in collection order, so a test of 100 s that
sorts late (``test_training_*``) could start while the other workers had
nothing left, and its worker end a minute after them. ``DURATIONS``
(``tests/data/suite_durations.json`` under the rootdir: each test's wall seconds in a full
profiled run, ``scripts/suite_profile.py --durations-out``; the tests under
a second are left out) gives each scope the sum of its tests' seconds, and
the scopes go out longest first (a test the file does not know counts
``UNKNOWN_S``, and ties keep xdist's order). A missing or stale file only
changes the order, never which tests run.

tests/conftest.py registers ``GroupPlugin`` when pytest-xdist is loaded.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

FOLDER_KEY = "mtrl_xdist_groups"  # workerinput: the folder each worker writes its groups into
DURATIONS = Path("tests") / "data" / "suite_durations.json"  # under the rootdir: {node id: wall seconds}
UNKNOWN_S = 0.5  # a test the durations file does not list: it took under a second, or it is new


def read_durations(path: Path) -> dict[str, float]:
    """The recorded wall seconds per node id; empty when the file is missing (the order is then xdist's)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise ValueError(f"{path}: expected {{node id: seconds}}, got {type(data).__name__}")
    return {str(k): float(v) for k, v in data.items()}


def longest_first(scopes: dict[str, list[str]], durations: dict[str, float]) -> list[str]:
    """The scope names, those whose tests are expected to take longest first (ties keep ``scopes``' order)."""
    expected = {name: sum(durations.get(nodeid, UNKNOWN_S) for nodeid in ids) for name, ids in scopes.items()}
    return sorted(scopes, key=lambda name: -expected[name])


def groups_of(items: list[pytest.Item]) -> dict[str, str]:
    """``{node id: group}`` of the items with an ``xdist_group`` mark (several names joined as xdist joins them)."""
    found: dict[str, str] = {}
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        if names:
            found[item.nodeid] = "_".join(sorted(names))
    return found


class GroupScheduling(LoadGroupScheduling):
    """``LoadGroupScheduling`` whose groups come from the workers' files (module docstring)."""

    def __init__(self, config: pytest.Config, log: Any, folder: Path, durations: dict[str, float]) -> None:
        super().__init__(config, log)
        self.folder = folder
        self.groups: dict[str, str] | None = None
        self.durations = durations
        self.ordered = False

    def _assign_work_unit(self, node: Any) -> None:
        """xdist's, with the queue put longest first (module docstring) before the first scope goes out.

        xdist builds the queue and assigns from it in one call (``schedule``);
        its first assignment is the first moment the whole queue exists.
        """
        if not self.ordered:
            self.ordered = True
            if self.durations:
                queue = {name: list(unit) for name, unit in self.workqueue.items()}
                for name in longest_first(queue, self.durations):
                    self.workqueue.move_to_end(name)
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:  # every worker has finished collecting before the first test is scheduled
            self.groups = self._read_groups()
        return self.groups.get(nodeid) or super()._split_scope(nodeid)

    def _read_groups(self) -> dict[str, str]:
        groups: dict[str, str] = {}
        for node in self.nodes:
            path = self.folder / f"{node.gateway.id}.json"
            if not path.is_file():
                raise RuntimeError(f"worker {node.gateway.id} wrote no xdist groups to {path}: tests/_xdist_groups.py's "
                                   "GroupPlugin must be registered on every worker (tests/conftest.py)")
            groups.update(json.loads(path.read_text()))
        return groups


class GroupPlugin:
    """Controller: names the folder and schedules by the groups. Worker: writes its groups there."""

    def __init__(self) -> None:
        self.folder: Path | None = None

    def pytest_configure_node(self, node: Any) -> None:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="mtrl-xdist-groups-"))
        node.workerinput[FOLDER_KEY] = str(self.folder)

    @pytest.hookimpl(trylast=True)  # after -k / -m deselection and xdist's own hook
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        workerinput = getattr(config, "workerinput", None)  # set on xdist workers only
        if workerinput is None or FOLDER_KEY not in workerinput:
            return
        path = Path(workerinput[FOLDER_KEY]) / f"{workerinput['workerid']}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(groups_of(items)))
        partial.replace(path)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> GroupScheduling | None:
        if config.getvalue("dist") != "loadgroup" or self.folder is None:
            return None
        return GroupScheduling(config, log, self.folder, read_durations(config.rootpath / DURATIONS))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
