"""Run a callback the moment a module's code has run: a post-import hook on ``sys.meta_path``.

mtrl patches an SDK only once the agent's process has loaded it: importing
``anthropic``, ``botocore`` or ``google.genai`` for an agent that uses
``openai`` only costs a second of CPU per process, and asking the path
whether they are installed (``find_spec``) rescans ``sys.path``. A module
not loaded yet is *watched* instead: :class:`ImportWatch`, one finder on
``sys.meta_path``, finds a watched module's spec through the other finders
and wraps its loader's ``exec_module`` so that the callback runs right after
the module's code, in the importing thread, while it still holds the
module's import lock. No other thread can reach the module through an import
before the callback has returned, so no call reaches an unpatched class.

Races: :meth:`ImportWatch.watch` reads ``sys.modules`` and adds the watch
under the module's own import lock, the lock an import of it holds from its
``find_spec`` to the end of its code. So either the import ran before (the
module is there: the caller installs now, after waiting for an import in
progress in another thread) or its ``find_spec`` comes after the watch was
added (the callback runs). A module whose code raises is not called back and
stays watched; a callback that raises fails the import (the module cannot be
used unpatched without a word). Once on ``sys.meta_path`` the finder stays
(a set lookup per import): taking it out while another thread's import walks
that list would make that import skip a finder. :meth:`ImportWatch.remove`
takes it out (tests).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from importlib import _bootstrap  # the per-module import lock (_ModuleLockManager); CPython's own, stable since 3.3
from types import ModuleType
from typing import Any, Callable

OnLoaded = Callable[[ModuleType], None]


class ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``on_loaded(module)`` after a watched module's code has run; holds the names watched."""

    def __init__(self, on_loaded: OnLoaded) -> None:
        self._on_loaded = on_loaded
        self._watched: set[str] = set()
        self._lock = threading.Lock()  # guards _watched and this finder's place on sys.meta_path
        self._finding = threading.local()  # names this thread is finding now: other finders may ask again

    def watch(self, name: str) -> ModuleType | None:
        """The module if it is loaded (waiting for an import of it in progress elsewhere); else None, and
        ``on_loaded`` will be called when it is."""
        with _bootstrap._ModuleLockManager(name):  # no import of `name` is between its find_spec and its end now
            module = sys.modules.get(name)
            if module is None:
                with self._lock:
                    self._watched.add(name)
                    if self not in sys.meta_path:
                        sys.meta_path.insert(0, self)
                return None
        return module

    def is_watching(self, name: str) -> bool:
        """Whether ``name`` is watched (read without the lock: a name is added under its module's import lock, so
        one watched here is hooked in every import of it that has not begun)."""
        return name in self._watched

    def remove(self) -> None:
        """Watch nothing and leave ``sys.meta_path`` (a loader already wrapped still calls back)."""
        with self._lock:
            self._watched.clear()
            while self in sys.meta_path:
                sys.meta_path.remove(self)

    # ------------------------------------------------------------------ the finder
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        finding = self._finding.__dict__.setdefault("names", set())
        if name not in self._watched or name in finding:
            return None
        finding.add(name)
        try:
            spec = _find_elsewhere(self, name, path, target)
        finally:
            finding.discard(name)
        if spec is not None and spec.loader is not None:
            _call_back_after(spec, self._loaded)
        return spec

    def _loaded(self, module: ModuleType) -> None:
        self._on_loaded(module)
        with self._lock:  # the finder stays: another thread's import may be iterating sys.meta_path now, and a
            self._watched.discard(module.__name__)  # finder removed under it would make it skip the next one


def _find_elsewhere(watch: ImportWatch, name: str, path: Any, target: Any) -> importlib.machinery.ModuleSpec | None:
    """The spec the rest of ``sys.meta_path`` finds (path entries, editable installs, other hooks), as import would."""
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if finder is watch or find is None:
            continue
        spec = find(name, path, target)
        if spec is not None:
            return spec
    return None


def _call_back_after(spec: importlib.machinery.ModuleSpec, callback: OnLoaded) -> None:
    """Make ``spec``'s loader call ``callback(module)`` after running this module's code, once."""
    loader = spec.loader
    try:
        inner = loader.exec_module  # type: ignore[union-attr]
    except AttributeError:  # a legacy load_module-only loader: run it through a loader that has exec_module
        spec.loader = _Calling(loader, callback)
        return

    def exec_module(module: ModuleType) -> None:
        if module.__name__ != spec.name:  # a loader shared by several modules: only ours is called back
            return inner(module)
        try:
            inner(module)
        finally:
            vars(loader).pop("exec_module", None)  # the loader is its own again, for reload and introspection
        callback(module)

    if isinstance(loader, (type, ModuleType)) or not hasattr(loader, "__dict__"):
        spec.loader = _Calling(loader, callback)  # a loader shared as a class or module: not ours to change
    else:
        loader.exec_module = exec_module  # type: ignore[union-attr]  # this spec's own loader instance


class _Calling(importlib.abc.Loader):
    """A loader in front of another: runs the module with it, then calls back; everything else is the other's."""

    def __init__(self, inner: Any, callback: OnLoaded) -> None:
        self._inner, self._callback = inner, callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        if hasattr(self._inner, "exec_module"):
            self._inner.exec_module(module)
        else:
            self._inner.load_module(module.__name__)
        self._callback(sys.modules.get(module.__name__, module))

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package, ...
        return getattr(self._inner, name)


__all__ = ["ImportWatch", "OnLoaded"]
