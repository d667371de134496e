"""Imports as in an environment holding only what a docs page says to install (tests/test_docs.py).

Loaded by every Python process of a page's blocks (this folder is on their
``PYTHONPATH``). ``MTRL_DOCS_BLOCKED`` names a JSON file of the distributions
the page does not install and their dotted module names
(tests/_docs_installs.py works them out). The path finder reports each module,
and everything below it, as not installed, and leaves those distributions out
of ``importlib.metadata``: ``import`` raises ``ModuleNotFoundError``,
``importlib.util.find_spec`` returns None and ``importlib.metadata.version``
raises ``PackageNotFoundError``, as they would where the package is absent.
"""

import json
import os
import re
import sys
from importlib.machinery import PathFinder


class _OnlyWhatThePageInstalls:
    """``PathFinder``, blind to the blocked modules and distributions."""

    modules: frozenset = frozenset()
    distributions: frozenset = frozenset()

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        parts = fullname.split(".")
        if any(".".join(parts[:i]) in cls.modules for i in range(1, len(parts) + 1)):
            return None
        return PathFinder.find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            # the name from the dist-info folder's name where it has one: reading every METADATA file would cost
            # each entry_points() call seconds
            name = getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or ""
            if re.sub(r"[-_.]+", "-", name).lower() not in cls.distributions:
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


def _install() -> None:
    listed = os.environ.get("MTRL_DOCS_BLOCKED")
    if not listed:
        return
    with open(listed, encoding="utf-8") as f:
        blocked = json.load(f)
    _OnlyWhatThePageInstalls.modules = frozenset(blocked["modules"])
    _OnlyWhatThePageInstalls.distributions = frozenset(blocked["distributions"])
    sys.meta_path[:] = [_OnlyWhatThePageInstalls if f is PathFinder else f for f in sys.meta_path]


_install()
