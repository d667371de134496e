"""The one way mtrl_adapters replaces a method of a client library: declared patches, composed in a declared order.

Redirecting an SDK's calls to the coordinator, or letting a non-policy call
pass by, means replacing a method of the SDK's class (openai's
``BaseClient._build_request``, botocore's ``BaseClient._make_api_call``,
Strands' ``Agent.__init__``, ...). Such a replacement is process-wide by
nature, because the class is; this module is the one place that makes it.

* A :class:`Patch` is a value: its target (owner class and attribute), the
  layer it belongs to, and ``wrap``, the factory that takes the next callable
  inward (the original, or the layer below) and returns the new function.
* A :class:`PatchSet` declares its layers' order, outermost first. The layers
  installed on one method are composed in that order into ONE installed
  function, whatever order they were installed in: installing a layer
  rebuilds the composition from the original.
* The installed function is marked: ``__mtrl_patch__`` holds the original,
  the layers and the function itself (a copy of the mark that ``functools.wraps``
  carries onto someone else's wrapper is told apart by that identity), and
  ``__mtrl_original__`` the original.
* ``install`` is idempotent (a layer already there: ``False``) and, like
  ``uninstall``, serialized by the set's lock. Uninstalling the last layer
  puts back exactly what was there: the same object in the owner's
  ``__dict__``, or no entry at all where the method was inherited.

* ``install_when_imported`` installs a patch whose module is loaded and
  leaves the others waiting for their module (the set's
  :class:`~._on_import.ImportWatch`, a post-import hook), installed the moment
  its code has run; ``call_when_imported`` does the same for an action (an
  adapter that must import the library to declare its patches). So mtrl
  never imports an SDK, and one loaded later is never called unpatched.

What is installed lives on the patched attribute itself (its mark), because
the class is the process's anyway; a set holds its layer order, its lock,
and what waits for a module to load. :data:`PATCHES` is the set every adapter installs through, so one lock
orders them all.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence

from ._on_import import ImportWatch

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]  # the next callable inward -> the function in its place
Action = Callable[[ModuleType], Any]  # called with a module the moment it is loaded (call_when_imported)

MARK = "__mtrl_patch__"
ORIGINAL = "__mtrl_original__"
_ABSENT = object()


class PatchTargetMissing(AttributeError):
    """A patch's module, class or method is not where the patch says (a library version mtrl does not know)."""


@dataclass(frozen=True)
class Patch:
    """One wrapper for one method: where it goes, which layer it is, and how it wraps the next callable inward.

    ``owner`` is the class (or module), or ``"package.module:Class"``
    (``"package.module"`` for a module-level function), imported at install,
    so declaring a patch imports nothing. A classmethod or staticmethod is
    wrapped as its function (a classmethod's ``cls`` comes first) and put back
    as one. ``required=False`` makes a method this version of the library
    lacks a skip rather than an error.
    """

    owner: str | type | ModuleType
    attribute: str
    layer: str
    wrap: Wrap
    required: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.owner, str):
            module, colon, qualname = self.owner.partition(":")
            if not module or (colon and not qualname) or " " in self.owner:
                raise ValueError(f"Patch.owner must be a class, a module, 'package.module:Class' or 'package.module', "
                                 f"not {self.owner!r}")
        elif not isinstance(self.owner, (type, ModuleType)):
            raise TypeError(f"Patch.owner must be a class, a module, 'package.module:Class' or 'package.module', "
                            f"not {self.owner!r}")
        if not self.attribute.isidentifier():
            raise ValueError(f"Patch.attribute must be a method name, not {self.attribute!r}")
        if not callable(self.wrap):
            raise TypeError(f"Patch.wrap must be a callable (next callable -> function), not {self.wrap!r}")

    @property
    def target(self) -> str:
        """``package.module.Class.attribute``, as errors name it."""
        if isinstance(self.owner, (type, ModuleType)):
            return f"{_name(self.owner)}.{self.attribute}"
        return f"{self.owner.replace(':', '.')}.{self.attribute}"


@dataclass(frozen=True)
class _Installed:
    """The mark on an installed function: what it replaced and what it is made of (outermost layer first)."""

    patchset: "PatchSet"
    original: Any  # the function that was there (read through the class; a classmethod's __func__)
    own: Any  # the owner's own __dict__ entry, or _ABSENT where the method was inherited
    patches: tuple[Patch, ...]
    function: Any  # the installed function itself
    kind: type | None  # classmethod or staticmethod where the method is one: the function is put back as one


class PatchSet:
    """Installs :class:`Patch` values; the layers of one method composed in ``layers`` order, outermost first."""

    def __init__(self, layers: Sequence[str]) -> None:
        layers = tuple(layers)
        if not layers or len(set(layers)) != len(layers) or not all(isinstance(n, str) and n for n in layers):
            raise ValueError(f"PatchSet layers must be distinct non-empty names, not {layers!r}")
        self.layers = layers
        self._lock = threading.Lock()
        self._waiting: dict[str, set[Patch]] = {}  # module name -> patches to install the moment it is loaded
        self._actions: dict[str, set[Action]] = {}  # module name -> actions to call the moment it is loaded
        self._imports = ImportWatch(self._loaded)

    def install(self, patch: Patch) -> bool:
        """Put ``patch``'s layer on its method; True if installed now, False if it already was (or an optional
        method is absent)."""
        self._rank(patch)  # an undeclared layer is refused before anything is imported
        owner = _resolve(patch)
        if self._holds(owner, patch):  # the common case (every rollout's instrument()), read without the lock
            return False
        with self._lock:
            current, kind = _read(owner, patch.attribute)
            if current is _ABSENT:
                if patch.required:
                    raise PatchTargetMissing(_missing(patch, f"{_name(owner)} has no attribute {patch.attribute!r}"))
                return False
            mark = self._mark(current, patch)
            if mark is not None and patch in mark.patches:
                return False
            if mark is not None and mark.function is not current:
                raise RuntimeError(
                    f"cannot add mtrl's {patch.layer!r} layer to {patch.target}: another library wrapped that method "
                    "over mtrl's own wrapper since it was installed; call mtrl_adapters.instrument() before "
                    "installing the other library's instrumentation")
            clash = [p for p in mark.patches if p.layer == patch.layer] if mark is not None else []
            if clash:
                raise ValueError(f"{patch.target} already holds a different {patch.layer!r} layer "
                                 f"({clash[0].wrap!r}); one wrapper per layer and method")
            if mark is None:
                original, own, patches = current, vars(owner).get(patch.attribute, _ABSENT), ()
            else:
                original, own, patches = mark.original, mark.own, mark.patches
            self._put(owner, patch.attribute, original, own, patches + (patch,), kind)
            return True

    def install_all(self, patches: Sequence[Patch]) -> bool:
        """Install each patch; True if any was installed now."""
        return any([self.install(patch) for patch in patches])

    def install_when_imported(self, patches: Sequence[Patch]) -> bool:
        """Install each patch whose module is loaded now; the others the moment their module is loaded (in the
        importing thread, before any import of it returns), never importing a module. True if any was installed now.

        Each is installed through :meth:`install`, so layers landing on one method at different times still
        compose in the declared order."""
        now = []
        for patch in patches:
            if not isinstance(patch.owner, str):
                now.append(patch)
                continue
            self._rank(patch)
            module_name = patch.owner.partition(":")[0]
            if self._holds_loaded(module_name, patch):  # every rollout's call once installed: no lock, no watch
                continue
            if (patch in self._waiting.get(module_name, ()) and self._imports.is_watching(module_name)
                    and module_name not in sys.modules):  # sys.modules read last: an import begun since is seen
                continue  # waiting, and watched (so any import of it from now on is hooked): nothing to do
            with self._lock:  # waiting before watched: a load between the two finds the patch waiting
                self._waiting.setdefault(module_name, set()).add(patch)
            if self._imports.watch(module_name) is not None:
                with self._lock:
                    self._waiting.get(module_name, set()).discard(patch)
                now.append(patch)
        return self.install_all(now)

    def call_when_imported(self, module_name: str, action: Action) -> bool:
        """Call ``action(module)`` now if ``module_name`` is loaded (True), else the moment it is (False): for an
        adapter whose patches are declared in a module that imports the library (Strands' ``Agent``, ...).
        ``action`` is called in the importing thread after the module's waiting patches are installed, so it
        must be idempotent and hashable (a module-level function)."""
        module = sys.modules.get(module_name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            action(module)
            return True
        if (action in self._actions.get(module_name, ()) and self._imports.is_watching(module_name)
                and module_name not in sys.modules):
            return False  # waiting, watched: the hook calls it
        with self._lock:
            self._actions.setdefault(module_name, set()).add(action)
        module = self._imports.watch(module_name)
        if module is None:
            return False
        with self._lock:
            self._actions.get(module_name, set()).discard(action)
        action(module)
        return True

    def stop_watching(self) -> None:
        """Forget the patches waiting for a module and take the import hook off ``sys.meta_path`` (tests)."""
        with self._lock:
            self._waiting.clear()
            self._actions.clear()
        self._imports.remove()

    def waiting(self) -> dict[str, tuple[Patch | Action, ...]]:
        """The patches and actions waiting for their module to be loaded, by module name."""
        with self._lock:
            names = {name for name, items in (*self._waiting.items(), *self._actions.items()) if items}
            return {name: (*self._waiting.get(name, ()), *self._actions.get(name, ())) for name in names}

    def uninstall(self, patch: Patch) -> bool:
        """Take ``patch``'s layer off its method (the original back when it was the last); True if it was there."""
        owner = _resolve(patch)
        with self._lock:
            current, kind = _read(owner, patch.attribute)
            mark = self._mark(current, patch)
            if mark is None or mark.function is not current or patch not in mark.patches:
                return False
            rest = tuple(p for p in mark.patches if p != patch)
            if rest:
                self._put(owner, patch.attribute, mark.original, mark.own, rest, kind)
            elif mark.own is _ABSENT:
                delattr(owner, patch.attribute)
            else:
                setattr(owner, patch.attribute, mark.own)
            return True

    def layers_on(self, owner: type | ModuleType, attribute: str) -> tuple[str, ...]:
        """The layers installed on ``owner.attribute`` by this set, outermost first (empty: none)."""
        current, _ = _read(owner, attribute)
        mark = getattr(current, MARK, None)
        if not isinstance(mark, _Installed) or mark.patchset is not self or mark.function is not current:
            return ()
        return tuple(p.layer for p in mark.patches)

    # ------------------------------------------------------------------ internals
    def _loaded(self, module: ModuleType) -> None:
        """The import hook's callback: ``module``'s code has run; install what waits for it, in the declared
        order of layers (each install recomposes the method from its original)."""
        with self._lock:
            patches = self._waiting.pop(module.__name__, set())
            actions = self._actions.pop(module.__name__, set())
        self.install_all(sorted(patches, key=self._rank))
        for action in actions:
            action(module)

    def _holds_loaded(self, module_name: str, patch: Patch) -> bool:
        module = sys.modules.get(module_name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False
        try:
            return self._holds(_resolve(patch), patch)
        except PatchTargetMissing:
            return False

    def _holds(self, owner: Any, patch: Patch) -> bool:
        current, _ = _read(owner, patch.attribute)
        mark = getattr(current, MARK, None)
        return isinstance(mark, _Installed) and mark.patchset is self and patch in mark.patches

    def _rank(self, patch: Patch) -> int:
        if patch.layer not in self.layers:
            raise ValueError(f"Patch.layer {patch.layer!r} (for {patch.target}) is not one of this PatchSet's "
                             f"layers {self.layers!r}")
        return self.layers.index(patch.layer)

    def _mark(self, current: Any, patch: Patch) -> _Installed | None:
        mark = getattr(current, MARK, None) if current is not _ABSENT else None
        if not isinstance(mark, _Installed):
            return None
        if mark.patchset is not self:
            raise RuntimeError(f"{patch.target} is patched by another PatchSet; one set per process "
                               "(mtrl_adapters._patches.PATCHES) keeps the layers in one order")
        return mark

    def _put(self, owner: Any, attribute: str, original: Any, own: Any, patches: tuple[Patch, ...],
             kind: type | None) -> None:
        """Compose ``patches`` (any order) over ``original`` in the declared order and install the result."""
        ordered = tuple(sorted(patches, key=self._rank))
        function = original
        for patch in reversed(ordered):  # innermost first: each layer wraps the ones below it
            wrapped = patch.wrap(function)
            if wrapped is function or not callable(wrapped):
                raise TypeError(f"the {patch.layer!r} wrap of {patch.target} returned {wrapped!r}; it must return "
                                "a new function that calls the one it was given")
            function = wrapped
        setattr(function, MARK, _Installed(self, original, own, ordered, function, kind))
        setattr(function, ORIGINAL, original)
        setattr(owner, attribute, kind(function) if kind is not None else function)


def _read(owner: Any, attribute: str) -> tuple[Any, type | None]:
    """The function at ``owner.attribute`` (a classmethod's or staticmethod's own function) and which of those
    it is (None: a plain method or function); ``_ABSENT`` where there is none."""
    raw = vars(owner).get(attribute, _ABSENT)
    if raw is _ABSENT:  # inherited (or absent): found where attribute lookup would, without running descriptors
        raw = inspect.getattr_static(owner, attribute, _ABSENT)
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__, type(raw)
    return getattr(owner, attribute, _ABSENT), None


def _resolve(patch: Patch) -> Any:
    """The owner class or module, imported if need be. A module another thread is importing is waited for (its
    import lock); one this thread is importing (LiteLLM's import hook, after the module ran) is taken as it is."""
    if isinstance(patch.owner, (type, ModuleType)):
        return patch.owner
    module_name, _, qualname = patch.owner.partition(":")
    module = sys.modules.get(module_name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        try:  # the import system waits for a module another thread is importing now (half made in sys.modules)
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PatchTargetMissing(_missing(patch, f"module {module_name!r} cannot be imported ({exc})")) from exc
    if not qualname:
        return module
    owner: Any = module
    for part in qualname.split("."):
        owner = getattr(owner, part, _ABSENT)
        if owner is _ABSENT:
            raise PatchTargetMissing(_missing(patch, f"module {module_name!r} has no {qualname!r}"))
    if not isinstance(owner, type):
        raise PatchTargetMissing(_missing(patch, f"{patch.owner!r} is {owner!r}, not a class"))
    return owner


def _name(owner: Any) -> str:
    if isinstance(owner, ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def _missing(patch: Patch, why: str) -> str:
    return (f"mtrl cannot install its {patch.layer!r} patch on {patch.target}: {why}. The installed library is "
            "likely a version whose internals mtrl does not know; pin the version mtrl is tested with, or file it")


PATCHES = PatchSet((
    "selective",  # outermost: decides whether a call is the policy's; a non-policy call runs the rest with no rollout
    "redirect",  # points a policy call at the rollout (an SDK's request options, a botocore client's event handlers)
    "guard",  # refuses inside a rollout what mtrl cannot capture (LiteLLM's own HTTP client)
    "observe",  # notes what a call carries for the records (an MCP server's declared name, a tool result's error)
    "hooks",  # gives an object built inside a rollout mtrl's capture hooks (Strands' Agent.__init__)
))
"""The process's one set (the patched classes are the process's): every adapter installs through it."""

__all__ = ["Action", "MARK", "ORIGINAL", "PATCHES", "Patch", "PatchSet", "PatchTargetMissing", "Wrap"]
