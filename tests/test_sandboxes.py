"""Isolation of the namespace sandbox (bubblewrap), proved on this machine with real processes.

One rollout's sandbox cannot read or write another's workspace or the
host's files outside its own, sees none of their processes, inherits none
of the run's environment, reaches the coordinator (a real one, serving a
model call made from inside) and no other address, is killed at its
timeout and its deadline with every child, and leaves nothing behind:
after ``close``, after a cancelled rollout, and after its owner is
SIGKILLed (the reaper), with the next run's sweep as the last resort.
Skipped, with bwrap's reason, only where it cannot create namespaces.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from _sandbox_support import processes_with, require, sandbox_root
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.sandboxes import SandboxError, Sandboxes
from mtrl_runtime.types import CommandResult, Sandbox, SandboxProcess, Task

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def root():
    yield from sandbox_root()


@pytest.fixture
def provider(root):
    require("bubblewrap", root=str(root))
    made = Sandboxes({"kind": "bubblewrap", "root": str(root), "timeout_s": 30})
    yield made
    asyncio.run(made.close())


def marker() -> str:
    return f"mtrl-test-{uuid.uuid4().hex[:12]}"


async def gone(pids_of, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pids_of():
            return True
        await asyncio.sleep(0.05)
    return not pids_of()


# --------------------------------------------------------------------------- the workspace and the host


async def test_commands_and_files_run_in_the_rollouts_own_workspace(provider):
    async with provider.sandbox("files") as box:
        assert isinstance(box, Sandbox) and box.workdir == "/workspace"
        await box.write_file("pkg/mod.py", "VALUE = 6 * 7\n")
        result = await box.run(["python3", "-B", "-c", "import pkg.mod, os; print(pkg.mod.VALUE, os.getcwd())"])
        assert isinstance(result, CommandResult) and result.ok, result
        assert result.stdout == "42 /workspace\n"
        assert await box.list_files() == ["pkg/mod.py"]
        assert await box.read_file("pkg/mod.py") == b"VALUE = 6 * 7\n"
        assert (box.host_workspace / "pkg" / "mod.py").read_text() == "VALUE = 6 * 7\n"
        with pytest.raises(FileNotFoundError):
            await box.read_file("missing.py")
        state = await box.run("echo kept > /tmp/t; echo home > ~/h")
        assert state.ok and (await box.run("cat /tmp/t ~/h")).stdout == "kept\nhome\n"  # /tmp and $HOME persist


async def test_a_rollout_cannot_read_or_write_another_rollouts_files_or_the_hosts(provider, monkeypatch):
    monkeypatch.setenv("MTRL_TEST_SECRET_KEY", "do-not-leak")
    secret = marker()
    async with provider.sandbox("a") as a, provider.sandbox("b") as b:
        assert (await a.run(f"echo {secret} > secret.txt; echo {secret} > /tmp/s; echo {secret} > ~/s")).ok
        probes = {
            "a's workspace by its host path": f"cat {a.host_workspace}/secret.txt",
            "a's folder": f"ls {a.dirs.path}",
            "the sandboxes' root": f"ls {provider.root}",
            "this repository": f"cat {REPO / 'pyproject.toml'}",
            "the test's own file": f"cat {Path(__file__)}",
            "root's home": "ls /root",
            "the shadow file": "cat /etc/shadow",
        }
        for what, probe in probes.items():
            result = await b.run(probe)
            assert not result.ok and secret not in result.stdout, (what, result)
        assert secret not in (await b.run("cat /workspace/* /tmp/* ~/* 2>/dev/null; true")).stdout
        for target in ("/usr/evil", "/etc/evil", f"{a.host_workspace}/evil", "/evil", "/run/mtrl/evil", "/proc/evil"):
            result = await b.run(f"echo x > {target}")
            assert not result.ok, (target, result)
        assert not (a.host_workspace / "evil").exists()
        assert (await b.run("echo mine > /workspace/own.txt")).ok
        assert (b.host_workspace / "own.txt").read_text() == "mine\n" and not (a.host_workspace / "own.txt").exists()
        env = (await b.run("env")).stdout
        assert "MTRL_TEST_SECRET_KEY" not in env and "do-not-leak" not in env  # the run's environment stays out
        status = (await b.run("cat /proc/self/status")).stdout
        assert "CapEff:\t0000000000000000" in status  # no capabilities, root run or not


async def test_a_read_only_folder_under_tmp_is_seen_and_the_sandbox_keeps_its_own_tmp(root):
    """``ro_paths`` naming a folder under the host's /tmp (a checkout there, holding its harness CLIs): the
    sandbox runs its tool from it and cannot write there, while its /tmp stays its own. bwrap mounts in
    argument order; with the folder bound before the sandbox's /tmp it was hidden (exit 127, 'No such file')."""
    require("bubblewrap", root=str(root))
    tools = Path(tempfile.mkdtemp(prefix="mtrl-test-tools-", dir="/tmp"))
    beside = tools.parent / f"{tools.name}-beside"  # the host's /tmp holds more than the folder shared
    try:
        os.chmod(tools, 0o755)  # under root the sandbox runs as a uid of its own
        (tools / "tool.sh").write_text("#!/bin/sh\necho tool-ran\n")
        os.chmod(tools / "tool.sh", 0o755)
        beside.write_text("host secret\n")
        provider = Sandboxes({"kind": "bubblewrap", "root": str(root), "timeout_s": 30, "ro_paths": [str(tools)]})
        try:
            async with provider.sandbox("tools") as box:
                ran = await box.run([str(tools / "tool.sh")])
                assert ran.ok and ran.stdout == "tool-ran\n", ran
                assert not (await box.run(f"echo x > {tools}/evil")).ok and not (tools / "evil").exists()
                assert not (await box.run(f"cat {beside}")).ok
                assert (await box.run("echo mine > /tmp/own && cat /tmp/own")).stdout == "mine\n"
                assert (box.dirs.tmp / "own").read_text() == "mine\n"  # the sandbox's own /tmp, not the host's
        finally:
            await provider.close()
    finally:
        shutil.rmtree(tools, ignore_errors=True)
        beside.unlink(missing_ok=True)


async def test_a_rollout_sees_none_of_the_other_rollouts_processes(provider):
    tag = marker()
    async with provider.sandbox("a") as a, provider.sandbox("b") as b:
        sleeper = await a.start(["sh", "-c", f"sleep 60 # {tag}"])
        assert isinstance(sleeper, SandboxProcess)
        assert await gone(lambda: not processes_with(tag), 5)  # it runs (seen from the host)
        seen = await b.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert tag not in seen.stdout
        assert tag not in (await b.run(f"kill -9 -1; pgrep -f {tag}; true")).stdout
        assert processes_with(tag)  # b could not kill it either
        await sleeper.kill()
        assert await gone(lambda: processes_with(tag))


# --------------------------------------------------------------------------- the network


class _Listener:
    """A TCP server on the host that records whether anything connected."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self.connected.set()
        conn.close()

    def close(self) -> None:
        self.sock.close()


def _host_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (where a service bound to 0.0.0.0 answers)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        out = []
    return [a for a in out if "." in a and not a.startswith("127.")]


PROBE = r"""
import json, socket, sys, urllib.request
targets, url, token, rollout = json.loads(sys.argv[1])
out = {}
for host, port in targets:
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[f"{host}:{port}"] = "reached"
    except OSError as exc:
        out[f"{host}:{port}"] = exc.__class__.__name__
try:
    s = socket.socket(socket.AF_UNIX); s.connect("\0mtrl-test-abstract"); out["abstract"] = "reached"
except OSError as exc:
    out["abstract"] = exc.__class__.__name__
out["health"] = urllib.request.urlopen(url + "/health", timeout=10).status
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hello from the sandbox"}]}).encode()
request = urllib.request.Request(f"{url}/rollouts/{rollout}/v1/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
out["reply"] = json.loads(urllib.request.urlopen(request, timeout=30).read())["choices"][0]["message"]["content"]
print(json.dumps(out))
"""


async def test_the_coordinator_is_the_only_address_a_sandbox_reaches(provider, served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "pong"))
    made = handle.coordinator.create_rollout(Task(id="net", prompt="hi"))
    loopback, wildcard = _Listener("127.0.0.1"), _Listener("0.0.0.0")
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0mtrl-test-abstract")
    abstract.listen(1)
    targets = [("127.0.0.1", loopback.port), ("127.0.0.1", wildcard.port), ("1.1.1.1", 53), ("8.8.8.8", 443)]
    targets += [(address, wildcard.port) for address in _host_addresses()]
    try:
        async with provider.sandbox("net", coordinator=handle.url) as box:
            assert box.coordinator_url == f"http://127.0.0.1:{handle.url.rsplit(':', 1)[1]}"
            result = await box.run(["python3", "-c", PROBE, json.dumps([targets, box.coordinator_url, made.token,
                                                                         made.rollout_id])], timeout_s=60)
            assert result.ok, result
            seen = json.loads(result.stdout)
    finally:
        loopback.close(), wildcard.close(), abstract.close()
    assert seen.pop("health") == 200 and seen.pop("reply") == "pong"
    assert all(outcome != "reached" for outcome in seen.values()), seen
    assert not loopback.connected.is_set() and not wildcard.connected.is_set()
    [turn] = handle.store.get_rollout(made.rollout_id).turns  # the call made inside was recorded as the rollout's
    assert turn.messages[-1]["content"] == "hello from the sandbox"


async def test_without_a_coordinator_a_sandbox_has_no_network_at_all(provider):
    async with provider.sandbox("offline") as box:
        assert box.coordinator_url is None
        result = await box.run(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 3)"])
        assert not result.ok and "Network is unreachable" in result.stderr
        assert (await box.run("ls /run/mtrl")).stdout == ""  # no socket to the coordinator either


# --------------------------------------------------------------------------- time, output, limits


async def test_a_command_is_killed_at_its_timeout_with_every_child(provider):
    tag = marker()
    async with provider.sandbox("slow") as box:
        started = time.monotonic()
        sleep = f"python3 -c 'import time; time.sleep(120)' {tag}"
        result = await box.run(["sh", "-c", f"{sleep} & setsid {sleep} & {sleep}"], timeout_s=1.5)
        assert result.timed_out and result.exit_code is None and not result.ok
        assert time.monotonic() - started < 6
        assert "killed at its deadline" in result.describe()
        assert await gone(lambda: processes_with(tag))  # the detached one too: the namespace died


async def test_a_cancelled_rollout_kills_its_running_command(provider):
    tag = marker()
    async with provider.sandbox("cancelled") as box:
        task = asyncio.ensure_future(box.run(["sh", "-c", f"sleep 120 # {tag}"], timeout_s=60))
        await asyncio.sleep(1.0)
        assert processes_with(tag)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await gone(lambda: processes_with(tag))


async def test_everything_in_a_sandbox_dies_at_its_deadline(provider):
    tag = marker()
    async with await provider.open("deadline", timeout_s=2.0) as box:
        server = await box.start(["sh", "-c", f"sleep 120 # {tag}"])
        assert await server.wait(timeout_s=30) is not None  # killed at the deadline, not after 30 s
        assert await gone(lambda: processes_with(tag))
        late = await box.run("echo too late")
        assert late.timed_out and "deadline has passed" in late.stderr
        with pytest.raises(SandboxError, match="deadline"):
            await box.start(["true"])


async def test_flooding_output_is_cut_at_the_cap_and_reported(root):
    require("bubblewrap", root=str(root))
    provider = Sandboxes({"kind": "bubblewrap", "root": str(root), "output_bytes": 4096})
    async with provider.sandbox("flood") as box:
        started = time.monotonic()
        result = await box.run("head -c 50000000 /dev/zero | tr '\\0' x; head -c 9000 /dev/zero >&2")
        assert result.ok and len(result.stdout) == 4096 and len(result.stderr) == 4096
        assert (result.stdout_dropped, result.stderr_dropped) == (50_000_000 - 4096, 9000 - 4096)
        assert "output over the cap dropped" in result.describe()
        assert time.monotonic() - started < 30
        proc = await box.start("yes")
        flood = await proc.output(timeout_s=1.0)  # a process that never stops: capped, then killed
        assert flood.timed_out and len(flood.stdout) == 4096 and flood.stdout_dropped > 0
    await provider.close()


async def test_memory_cpu_and_file_size_limits_hold(root):
    require("bubblewrap", root=str(root))
    provider = Sandboxes({"kind": "bubblewrap", "root": str(root), "memory_mb": 128, "cpu_s": 1, "max_file_mb": 1})
    async with provider.sandbox("limits") as box:
        memory = await box.run(["python3", "-c", "x = bytearray(512 * 1024 * 1024)"])
        assert not memory.ok and "MemoryError" in memory.stderr
        assert (await box.run(["python3", "-c", "x = bytearray(16 * 1024 * 1024)"])).ok  # below the limit
        started = time.monotonic()
        cpu = await box.run(["python3", "-c", "while True: pass"], timeout_s=60)
        assert not cpu.timed_out and cpu.exit_code != 0 and time.monotonic() - started < 30  # RLIMIT_CPU, not the timeout
        big = await box.run("head -c 5000000 /dev/zero > big.bin")
        assert not big.ok and (box.host_workspace / "big.bin").stat().st_size <= 1024 * 1024
    await provider.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC holds a sandbox's processes only where each sandbox has "
                                             "a uid of its own (mtrl running as root); rootless it is not enforced")
async def test_a_fork_bomb_stops_at_max_processes(root):
    require("bubblewrap", root=str(root))
    provider = Sandboxes({"kind": "bubblewrap", "root": str(root), "max_processes": 16})
    async with provider.sandbox("forks") as box:
        result = await box.run("for i in $(seq 64); do sleep 5 & done; wait", timeout_s=30)
        assert "fork" in result.stderr.lower() or "resource temporarily unavailable" in result.stderr.lower(), result
    await provider.close()


# --------------------------------------------------------------------------- nothing left behind


async def test_close_leaves_nothing_behind(provider, served, tiny_tok):
    tag = marker()
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"))
    box = await provider.open("tidy", coordinator=handle.url)
    folder = box.dirs.path
    await box.write_file("big.txt", "x" * 100_000)
    await box.run("mkdir -p locked/deeper && touch locked/deeper/f && chmod 000 locked/deeper locked")
    await box.start(["sh", "-c", f"sleep 120 # {tag}"])
    running = asyncio.ensure_future(box.run(["sh", "-c", f"sleep 121 # {tag}"], timeout_s=60))
    await asyncio.sleep(0.5)
    assert (folder / "run" / "coord.sock").exists() and processes_with(tag)
    await box.close()
    await box.close()  # once
    result = await asyncio.wait_for(running, 15)  # killed by close, not left running to its 60 s timeout
    assert not result.timed_out and result.exit_code != 0, result
    assert not folder.exists()
    assert await gone(lambda: processes_with(tag))
    assert provider.open_count == 0 and list(provider.root.iterdir()) == []
    with pytest.raises(SandboxError, match="closed"):
        await box.run("true")
    reaper = provider._reaper.pid
    await provider.close()
    assert reaper is not None and not Path(f"/proc/{reaper}").exists() or _zombie(reaper)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("kind", ["bubblewrap", "tempdir"])
def test_a_sigkilled_owner_leaves_nothing_behind(root, kind):
    """The run holding the sandboxes is SIGKILLed mid-command: its processes die and its folders go."""
    require(kind, root=str(root))
    tag = marker()
    owner = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_sandbox_owner.py")), kind, str(root), tag],
                             stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(owner.stdout.readline())
        folders = [Path(f) for f in info["folders"]]
        assert all((f / "workspace" / "work.txt").exists() for f in folders)
        assert len(processes_with(tag)) >= 3  # the owner and its two sleeps
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (processes_with(tag) or any(f.exists() for f in folders)):
        time.sleep(0.1)
    assert processes_with(tag) == [] and not any(f.exists() for f in folders)


async def test_the_next_run_sweeps_what_a_dead_run_left(root):
    require("bubblewrap", root=str(root))
    ended = subprocess.Popen(["true"])
    ended.wait()
    leftover = root / "left-abc123"
    (leftover / "workspace" / "locked").mkdir(parents=True)
    (leftover / "workspace" / "locked" / "f").write_text("x")
    os.chmod(leftover / "workspace" / "locked", 0)
    (leftover / "owner.json").write_text(json.dumps({"pid": ended.pid, "start": 1, "kind": "bubblewrap"}))
    live = root / "live-def456"
    live.mkdir()
    (live / "owner.json").write_text(json.dumps({"pid": os.getpid(), "start": None, "kind": "bubblewrap"}))
    provider = Sandboxes({"kind": "bubblewrap", "root": str(root)})
    async with provider.sandbox("next"):
        pass
    assert not leftover.exists() and live.exists()
    assert provider.swept == [str(leftover)]
    await provider.close()
