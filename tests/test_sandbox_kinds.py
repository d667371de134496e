"""The sandbox registry, its settings in the config, each kind's command lines, and how agents reach it.

Docker and podman need a daemon this machine lacks: their command lines are
checked as built (``run_argv``, ``exec_argv``), the scripts they run inside
a container are run inside a namespace sandbox instead (the same ``sh``,
``timeout`` and ``kill``), and the live test runs only where a daemon
answers (it says why it skipped).
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from pathlib import Path

import pytest

from _sandbox_support import processes_with, require, sandbox_root
from mtrl_adapters import rollout_scope
from mtrl_runtime.config import ConfigError, MtrlConfig
from mtrl_runtime.executors import InProcessExecutor
from mtrl_runtime.rollouts import RolloutStack
from mtrl_runtime.sandboxes import (
    KINDS,
    SANDBOXES,
    SandboxIsolationWarning,
    Sandboxes,
    SandboxSettings,
    bwrap_argv,
    current_sandboxes,
    exec_argv,
    rollout_sandbox,
    run_argv,
)
from mtrl_runtime.sandboxes._container import EXEC_WRAPPER, KILL_SCRIPT
from mtrl_runtime.sandboxes._dirs import SandboxDirs
from mtrl_runtime.types import RolloutSpec, SamplingParams, Task


@pytest.fixture
def root():
    yield from sandbox_root()


def test_the_registry_and_the_settings_name_the_same_kinds():
    assert SANDBOXES.names() == sorted(KINDS)


@pytest.mark.parametrize("sandbox, needles", [
    ({"kind": "firejail"}, ["advanced.sandbox.kind", "firejail", "bubblewrap", "docker", "podman", "tempdir"]),
    ({"kind": "docker"}, ["advanced.sandbox", "image", "docker"]),
    ({"kind": "podman", "image": "x", "memroy_mb": 1}, ["advanced.sandbox.memroy_mb", "unknown key"]),
    ({"timeout_s": 0}, ["advanced.sandbox.timeout_s", "0"]),
    ({"ro_paths": ["opt/tools"]}, ["ro_paths", "opt/tools", "absolute"]),
])
def test_bad_sandbox_settings_are_errors_at_load_naming_the_field_and_value(sandbox, needles):
    with pytest.raises(ConfigError) as caught:
        MtrlConfig.from_dict({"advanced": {"sandbox": sandbox}})
    for needle in needles:
        assert needle in str(caught.value)


def test_each_kind_says_what_it_enforces():
    bubblewrap = Sandboxes({"kind": "bubblewrap", "memory_mb": 300}).describe()["enforced"]
    assert "RLIMIT_DATA" in bubblewrap["memory"] and "300 MB" in bubblewrap["memory"]
    docker = Sandboxes({"kind": "docker", "image": "x", "memory_mb": 300}).describe()["enforced"]
    assert "--memory" in docker["memory"] and "--pids-limit" in docker["processes"]
    tempdir = Sandboxes({"kind": "tempdir"}).describe()["enforced"]
    assert tempdir["isolation"].startswith("none") and "survives" in tempdir["time"]


def test_the_config_selects_the_kind_and_its_options():
    config = MtrlConfig.from_dict({"advanced": {"sandbox": {"kind": "docker", "image": "python:3.12-slim",
                                                            "memory_mb": 512, "cpus": 1.5}}})
    assert config.advanced.sandbox.kind == "docker" and config.advanced.sandbox.image == "python:3.12-slim"
    assert MtrlConfig().advanced.sandbox.kind == "bubblewrap"  # isolation unless asked otherwise
    with pytest.raises(ValueError, match="memroy_mb"):
        Sandboxes({"memroy_mb": 1})


def test_the_recorded_config_masks_what_the_sandbox_environment_holds():
    config = MtrlConfig.from_dict({"advanced": {"sandbox": {"env": {"GITHUB_TOKEN": "ghp_secret", "LANG": "C"}}}})
    recorded = config.recorded()["advanced"]["sandbox"]
    assert recorded["env"] == {"GITHUB_TOKEN": "**********", "LANG": "**********"} and "ghp_secret" not in str(recorded)
    assert config.advanced.sandbox.env["GITHUB_TOKEN"] == "ghp_secret"  # the running config keeps it


# --------------------------------------------------------------------------- bubblewrap's command line


def test_the_bubblewrap_command_line_shares_nothing_but_the_system_and_the_rollouts_folders(tmp_path):
    dirs = SandboxDirs(tmp_path / "box", None, None)  # ro_paths: the provider checks they exist, not the command line
    argv = bwrap_argv("/usr/bin/bwrap", dirs, SandboxSettings(ro_paths=["/opt/tools"]), ["python3", "x.py"],
                      {"PATH": "/usr/bin"}, "/workspace", workdir="/workspace", home="/home/sandbox")
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    binds = {(argv[i], argv[i + 1], argv[i + 2]) for i, a in enumerate(argv[:-2]) if a.startswith("--") and "bind" in a}
    assert ("--bind", str(dirs.workspace), "/workspace") in binds and ("--ro-bind", str(dirs.run), "/run/mtrl") in binds
    assert ("--ro-bind", "/opt/tools", "/opt/tools") in binds
    writable = {src for flag, src, _ in binds if flag == "--bind"}
    assert writable == {str(dirs.workspace), str(dirs.home), str(dirs.tmp)}
    assert all(dest not in ("/", "/home", "/root", "/tmp") or dest == "/tmp" for _, _, dest in binds)
    assert argv[argv.index("--remount-ro") + 1] == "/"
    assert argv[-3:] == ["--", "python3", "x.py"] and "--share-net" not in argv


def test_bubblewrap_binds_a_read_only_folder_inside_the_sandboxes_own_tmp_after_it(tmp_path):
    """bwrap mounts in argument order: shallowest destination first, the sandbox's own mounts last at a depth."""
    dirs = SandboxDirs(tmp_path / "box", None, None)
    shared = ["/tmp/project/.venv/harnesses", "/tmp", "/home"]
    argv = bwrap_argv("/usr/bin/bwrap", dirs, SandboxSettings(ro_paths=shared), ["true"], {}, "/workspace",
                      workdir="/workspace", home="/home/sandbox")
    at = {(argv[i], argv[i + 2]): i for i, a in enumerate(argv[:-2]) if a in ("--bind", "--ro-bind")}
    own_tmp = at[("--bind", "/tmp")]
    assert at[("--ro-bind", "/tmp")] < own_tmp < at[("--ro-bind", "/tmp/project/.venv/harnesses")]
    assert at[("--ro-bind", "/home")] < at[("--bind", "/home/sandbox")]
    assert max(at.values()) < argv.index("--remount-ro")


# --------------------------------------------------------------------------- docker / podman


def _settings(**changes):
    return SandboxSettings(kind="docker", image="python:3.12-slim", memory_mb=512, max_processes=64, cpus=2, cpu_s=30,
                           max_file_mb=8, **changes)


def test_the_container_is_started_without_network_capabilities_or_a_writable_root(tmp_path):
    dirs = SandboxDirs(tmp_path / "box", 200123, 200123)
    argv = run_argv("docker", "mtrl-box", _settings(ro_paths=["/opt/tools"]), dirs, coordinator_port=8731,
                    owner="42:777", user="200123:200123", rootless_podman=False, workdir="/workspace",
                    home="/home/sandbox")
    text = " ".join(argv)
    for expected in ("--network none", "--read-only", "--cap-drop ALL", "--security-opt no-new-privileges", "--init",
                     "--memory 512m", "--memory-swap 512m", "--pids-limit 64", "--cpus 2", "--ulimit cpu=30:30",
                     f"--ulimit fsize={8 * 1024 * 1024}:{8 * 1024 * 1024}", "--user 200123:200123",
                     "--label mtrl.sandbox.owner=42:777", f"-v {dirs.workspace}:/workspace:rw",
                     f"-v {dirs.run}:/run/mtrl:ro", f"-v {dirs.tmp}:/tmp:rw", "-v /opt/tools:/opt/tools:ro"):
        assert expected in text, expected
    image = argv.index("python:3.12-slim")
    assert argv[image - 2:image] == ["--entrypoint", "python3"]  # the main process is the relay ...
    assert argv[image + 1:image + 4] == ["/run/mtrl/relay.py", "8731", "/run/mtrl/coord.sock"]  # ... to the socket
    offline = run_argv("docker", "mtrl-box", _settings(), dirs, coordinator_port=None, owner="42:777", user=None,
                       rootless_podman=True, workdir="/workspace", home="/home/sandbox")
    assert "relay.py" not in " ".join(offline) and offline[offline.index("--entrypoint") + 1] == "sh"
    assert "--userns keep-id" in " ".join(offline) and "--user" not in offline


def test_each_container_command_runs_under_a_kill_timeout_in_its_own_group():
    argv = exec_argv("podman", "mtrl-box", ["python3", "-m", "unittest"], {"HOME": "/home/sandbox"}, "/workspace/src",
                     "abc123", 7.2)
    assert argv[:6] == ["podman", "exec", "-i", "-w", "/workspace/src", "-e"]
    assert argv[argv.index("mtrl-box") + 1:] == ["sh", "-c", EXEC_WRAPPER, "abc123", "8", "python3", "-m", "unittest"]
    assert exec_argv("docker", "b", ["true"], {}, "/", "t", None)[-2:] == ["0", "true"]  # no timeout: timeout 0


async def test_the_container_scripts_time_out_and_kill_whole_process_groups(root):
    """EXEC_WRAPPER and KILL_SCRIPT run here with the same sh, timeout and kill a container has."""
    require("bubblewrap", root=str(root))
    provider = Sandboxes({"kind": "bubblewrap", "root": str(root)})
    async with provider.sandbox("scripts") as box:
        await box.write_file("sleepers.sh", "python3 -c 'import time; time.sleep(60)' MARK-child &\n"
                                             "python3 -c 'import time; time.sleep(60)' MARK-main\n")
        count = "grep -l '[M]ARK' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
        started = time.monotonic()
        timed = await box.run(["sh", "-c", EXEC_WRAPPER, "t1", "1", "sh", "sleepers.sh"], timeout_s=30)
        assert timed.exit_code == 137 and time.monotonic() - started < 10  # timeout -s KILL at 1 s
        both = (f"sh -c '{EXEC_WRAPPER}' t2 0 sh sleepers.sh & sleep 1; {count}; "
                f"sh -c '{KILL_SCRIPT}' t2; sleep 0.5; {count}")
        killed = await box.run(["sh", "-c", both], timeout_s=30)
        assert killed.stdout.split() == ["2", "0"], killed  # the kill script ended the group: the child and the main
    await provider.close()


def test_a_live_container_sandbox_where_a_daemon_answers(root):
    image = os.environ.get("MTRL_TEST_CONTAINER_IMAGE", "python:3.12-slim")
    for runtime in ("docker", "podman"):
        reason = Sandboxes({"kind": runtime, "image": image, "root": str(root)}).unavailable()
        if reason is None:
            break
    else:
        pytest.skip(f"no container runtime answers here: {reason}")

    async def main() -> None:
        provider = Sandboxes({"kind": runtime, "image": image, "root": str(root), "memory_mb": 256})
        async with provider.sandbox("live") as box:
            await box.write_file("a.py", "print(6 * 7)")
            assert (await box.run(["python3", "a.py"])).stdout == "42\n"
            net = await box.run(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 3)"])
            assert not net.ok
            slow = await box.run(["sleep", "60"], timeout_s=2)
            assert slow.timed_out
            folder = box.dirs.path
        assert not folder.exists()
        await provider.close()

    asyncio.run(main())


# --------------------------------------------------------------------------- tempdir


async def test_a_tempdir_sandbox_warns_and_still_bounds_time_output_and_environment(root, monkeypatch):
    monkeypatch.setenv("MTRL_TEST_SECRET_KEY", "do-not-leak")
    provider = Sandboxes({"kind": "tempdir", "root": str(root), "output_bytes": 1024})
    with pytest.warns(SandboxIsolationWarning, match="isolates nothing"):
        box = await provider.open("plain")
    try:
        assert box.workdir == str(box.host_workspace)
        await box.write_file("f.txt", "hi")
        result = await box.run("pwd; cat f.txt; env")
        assert result.stdout.startswith(f"{box.host_workspace}\nhi") and "do-not-leak" not in result.stdout
        tag = f"mtrl-test-{os.getpid()}-tempdir"
        slow = await box.run(["sh", "-c", f"python3 -c 'import time; time.sleep(60)' {tag} & wait"], timeout_s=1)
        assert slow.timed_out and not processes_with(tag)
        assert (await box.run("yes | head -c 100000")).stdout_dropped == 100000 - 1024
    finally:
        await box.close()
    assert not box.dirs.path.exists()
    await provider.close()


# --------------------------------------------------------------------------- how an agent reaches its sandbox


def _spec(rollout_id: str = "r-1") -> RolloutSpec:
    return RolloutSpec(rollout_id, "g", Task(id="t"), "tok", "http://127.0.0.1:9", "policy", SamplingParams(), 4, 30.0)


async def test_the_executor_puts_the_runs_sandboxes_in_scope_for_the_agent(root):
    provider = Sandboxes({"kind": "tempdir", "root": str(root)})
    seen = {}

    async def agent(task):
        seen["provider"] = current_sandboxes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SandboxIsolationWarning)
            async with rollout_sandbox() as box:
                seen["name"], seen["folder"] = box.name, box.dirs.path
                seen["out"] = (await box.run("echo inside")).stdout

    def sync_agent(task):
        seen["sync"] = current_sandboxes()

    await InProcessExecutor(agent, sandboxes=provider).run(_spec())
    executor = InProcessExecutor(sync_agent, sandboxes=provider)
    await executor.run(_spec("r-2"))
    await executor.close()
    assert seen["provider"] is provider and seen["sync"] is provider
    assert seen["name"] == "r-1" and seen["out"] == "inside\n" and not Path(seen["folder"]).exists()
    assert current_sandboxes() is None  # only inside the rollout
    await provider.close()


async def test_rollout_sandbox_says_what_is_missing():
    with pytest.raises(RuntimeError, match="no sandboxes in scope"):
        async with rollout_sandbox():
            pass
    with pytest.raises(RuntimeError, match="no rollout in scope"):
        async with rollout_sandbox(sandboxes=Sandboxes({"kind": "tempdir"})):
            pass
    with rollout_scope(_spec()):
        pass


def test_the_stack_builds_the_configured_sandboxes_for_an_in_process_agent(tmp_path, tiny_tok):
    from mtrl_runtime.engines import ScriptedEngine

    config = MtrlConfig.from_dict({"advanced": {"sandbox": {"kind": "tempdir", "timeout_s": 5}}})
    stack = RolloutStack.build(config, store_path=tmp_path / "t.db", engine=ScriptedEngine(tiny_tok, lambda r, p: "x"),
                               agent_env=lambda task: None, serve=False)
    try:
        assert stack.executor.sandboxes.settings.kind == "tempdir"
        assert stack.executor.sandboxes.settings.timeout_s == 5
    finally:
        asyncio.run(stack.close())
