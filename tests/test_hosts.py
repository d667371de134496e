"""Rollouts across hosts that are separate on the network: Linux network namespaces made by the test.

Four hosts on one switch (``tests/_netns.py``), each its own namespace
with its own address and loopback: ``head`` (10.77.0.1) runs the Ray head
(no CPUs) and the training script (``_host_train.py``, docs/scaling.md's
``train_on_ray.py``) whose coordinator binds 10.77.0.1:8731 with a key;
``w1`` and ``w2`` are Ray worker nodes that join the head by its address;
``agentcore`` serves the AgentCore stand-in. Nothing of the run is on a
loopback another host could share: a worker reaches the coordinator only
over the switch.

The Ray test trains two steps, its rollouts spread over the worker hosts,
and takes ``w1`` down (every process in its namespace SIGKILLed) while its
rollouts are in flight: those fail with Ray's reason, the group policy
(``retry``) runs their replacements on ``w2``, and the SQLite store shows
every group trained whole, once, with no failed rollout in it and no
completed one left out. The AgentCore test runs ``mtrl train --agent ARN``
on ``head`` against the stand-in on ``agentcore``, whose runtime calls the
coordinator back at ``advanced.agentcore.coordinator_url``.

Skipped, with the reason, where namespaces cannot be made (not root, no
CAP_NET_ADMIN, no ``ip``): ``namespaces_problem`` tries to make one.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from _adapter_tools import key_of
from _groups import processes
from _netns import Host, Network, namespaces_problem
from mtrl_integrations.agentcore_standin import TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY

pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(900), processes]  # never beside another cluster or torchrun job
TESTS = Path(__file__).resolve().parent
PYTHON = sys.executable
RAY = str(Path(sys.executable).with_name("ray"))
API_KEY = "a-long-random-string-for-the-hosts-test"
PORT = 8731
RAY_PORT = 6379
ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/mtrl_hosts-a1B2c3D4e5"
STANDIN_PORT = 9000
AWS_TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
                        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
# the head declares a node dead after 5 failed health checks 2 s apart (Ray's default: 3 s apart). A check of a
# killed node fails at once (its port refuses); one of a live node only after 10 s without an answer (Ray's
# default), so a raylet slowed by a busy machine is not declared dead (1 s timeouts did that at load 24)
WORKER_START_ATTEMPTS = 3
NODES_TIMEOUT_S = 360  # the training script's wait for every node: the workers' start attempts, one after another
HEALTH = {"RAY_health_check_period_ms": "2000", "RAY_health_check_failure_threshold": "5"}


def host_env(**extra: str) -> dict[str, str]:
    """This process's environment but its AWS settings (a host sees only the test credentials), with ``extra``."""
    python_path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    mine = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    return {**mine, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": python_path, "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    problem = namespaces_problem()
    if problem is not None:
        pytest.skip(f"hosts cannot be made of network namespaces here: {problem}")
    net = Network()
    try:
        for name in ("head", "w1", "w2", "agentcore"):
            net.add_host(name)
        yield net
    finally:
        net.close()


def wait_for_line(process: Any, text: str, timeout: float = 120) -> str:
    """The first line of ``process``'s log that holds ``text``; fails with the log if the process ends first."""
    deadline = time.monotonic() + timeout
    log = Path(process.log_path)
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if text in line:
                return line
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[3:]} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{process.args[3:]} did not print {text!r} in {timeout} s:\n{log.read_text()[-3000:]}")


@dataclass
class Services:
    """What the ``hosts`` fixture started: the Ray head's address, the workers' starter, the AgentCore stand-in."""

    ray_address: str
    workers: threading.Thread
    worker_errors: list[str]
    standin: Any
    standin_calls: Path


@pytest.fixture(scope="module")
def hosts(network: Network, ray_temp_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Services:
    """The Ray head on ``head`` (0 CPUs), a worker node of 2 CPUs on each of ``w1`` and ``w2``, the AgentCore
    stand-in on ``agentcore``.

    Started side by side where they can be (a process start costs seconds here): the head and the stand-in
    at once; once the head is up the fixture returns, and a thread starts w1, then w2 once w1 is up (two
    raylets registering at once on a busy machine can time out), while the training script starts and waits
    for its three nodes; the AgentCore test waits for the stand-in. Everything runs until the network closes
    (its teardown kills every process on every host)."""
    logs = tmp_path_factory.mktemp("hosts")
    head, agentcore = network.hosts["head"], network.hosts["agentcore"]
    address = f"{head.address}:{RAY_PORT}"
    node = network.popen(head, [RAY, "start", "--block", "--disable-usage-stats", "--head",
                                f"--node-ip-address={head.address}", f"--port={RAY_PORT}", "--num-cpus=0",
                                f"--temp-dir={ray_temp_dir}", "--include-dashboard=false"],
                         logs / "head.log", host_env(**HEALTH))
    standin = network.popen(agentcore, [PYTHON, str(TESTS / "_host_agentcore.py"), agentcore.address,
                                        str(STANDIN_PORT), ARN, str(logs / "standin-calls.jsonl")],
                            logs / "standin.log", host_env(**AWS_TEST_CREDENTIALS))
    wait_for_line(node, "Ray runtime started")
    errors: list[str] = []

    def start_worker(name: str) -> None:
        """``ray start`` on ``name``, started again (its host cleared first) when it gives up: Ray waits a fixed
        30 s for a new raylet to register, which a busy machine can exceed (CI once: "The current node timed
        out during startup"); an operator starts such a node again, and so does this."""
        worker, failures = network.hosts[name], []
        for attempt in range(WORKER_START_ATTEMPTS):
            started = network.popen(worker, [RAY, "start", "--block", "--disable-usage-stats",
                                             f"--address={address}", f"--node-ip-address={worker.address}",
                                             "--num-cpus=2"], logs / f"{name}.{attempt}.log", host_env())
            try:
                wait_for_line(started, "Ray runtime started")
                return
            except (RuntimeError, TimeoutError) as exc:
                failures.append(f"attempt {attempt + 1}: {type(exc).__name__}: {exc}")
                network.kill_host(worker)
        raise RuntimeError(f"{name} did not join in {WORKER_START_ATTEMPTS} attempts:\n" + "\n".join(failures))

    def start_workers() -> None:
        try:
            for name in ("w1", "w2"):
                start_worker(name)
        except Exception as exc:  # noqa: BLE001 - kept for the test's failure message
            errors.append(f"{type(exc).__name__}: {exc}")

    workers = threading.Thread(target=start_workers, name="ray-workers", daemon=True)
    workers.start()
    return Services(address, workers, errors, standin, logs / "standin-calls.jsonl")


def host_tasks(markers: Path, hold_on: Host) -> list[dict[str, Any]]:
    """Four tool-loop tasks (no tool error, no crash) whose rollouts hold on ``hold_on`` until it is taken down."""
    return [{"id": f"t{i:02d}", "prompt": f"What is the value of key K{i:02d} plus 5?",
             "data": {"markers": str(markers), "hold_on": hold_on.address, "hold_s": 90}} for i in (0, 1, 2, 4)]


def rollout_rows(db: Path) -> list[sqlite3.Row]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return conn.execute("SELECT r.*, (SELECT count(*) FROM turns t WHERE t.rollout_id = r.id) AS turns "
                            "FROM rollouts r").fetchall()


def test_training_across_hosts_survives_losing_a_worker_host(network, hosts, tmp_path, tiny_model_dir):
    head, w1, w2 = network.hosts["head"], network.hosts["w1"], network.hosts["w2"]
    run_dir, markers = tmp_path / "run", tmp_path / "markers"
    markers.mkdir()
    group_size, batch, steps = 2, 2, 2
    settings = {
        "ray_address": hosts.ray_address, "nodes": 3, "nodes_timeout_s": NODES_TIMEOUT_S, "tasks": host_tasks(markers, w1),
        "config": {"core": {"run_dir": str(run_dir), "model": str(tiny_model_dir), "group_size": group_size,
                            "train_batch_size": batch, "max_steps": steps, "max_turns": 8, "lora_rank": 4,
                            "lora_alpha": 8, "val_every": 0, "seed": 3, "sampling_params": {"max_tokens": 64}},
                   "advanced": {"server": {"host": head.address, "port": PORT, "api_key": API_KEY},
                                "group_policy": {"on_failure": "retry", "max_retries": 2},
                                "rollout_timeout_s": 120, "checkpoint_every": 0}},
    }
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    trainer = network.popen(head, [PYTHON, str(TESTS / "_host_train.py"), str(tmp_path / "settings.json")],
                            tmp_path / "train.log", host_env(), cwd=tmp_path)

    # take w1 down once one of its rollouts is in flight (its turns recorded, its reward not yet reported)
    def log() -> str:
        return (tmp_path / "train.log").read_text()[-4000:] + "".join(f"\nstarting a worker: {e}" for e in
                                                                     hosts.worker_errors)

    try:  # the cluster first (each worker may need a second start), then 150 s for a rollout to reach w1
        wait_for_line(trainer, "3 nodes up", timeout=NODES_TIMEOUT_S + 30)
    except (RuntimeError, TimeoutError) as exc:
        raise AssertionError(log()) from exc
    deadline = time.monotonic() + 150
    while not (held := [json.loads(p.read_text()) for p in markers.glob("*.json")
                        if json.loads(p.read_text())["node"] == w1.address]):
        assert trainer.poll() is None, log()
        assert time.monotonic() < deadline, "no rollout reached w1:\n" + log()
        time.sleep(0.2)
    killed = network.kill_host(w1)
    assert killed and not network.pids(w1)
    assert trainer.wait(timeout=150) == 0, log()

    ran = {r["rollout_id"]: r for r in (json.loads(p.read_text()) for p in markers.glob("*.json"))}
    # every rollout called the coordinator at the head's address, the one the config bound, and ran on a worker host
    assert {r["endpoint"].rstrip("/") for r in ran.values()} == {f"http://{head.address}:{PORT}"}
    assert {r["node"] for r in ran.values()} == {w1.address, w2.address}
    rows = {row["id"]: row for row in rollout_rows(run_dir / "trajectories.db")}
    assert set(ran) <= set(rows)
    on_w1 = {i for i, r in ran.items() if r["node"] == w1.address}
    assert {r["rollout_id"] for r in held} <= on_w1
    assert all(row["status"] in ("completed", "failed", "timed_out") for row in rows.values())  # none left running
    failed = {i for i, row in rows.items() if row["status"] != "completed"}
    assert on_w1 and on_w1 <= failed
    for rollout_id in failed:  # the ones w1 was running: failed with Ray's reason, never trained
        row = rows[rollout_id]
        assert row["status"] == "failed" and "the Ray worker running this rollout died" in row["error"], dict(row)
        assert row["trained_step"] is None
    assert all(rows[i]["turns"] > 0 for i in on_w1)  # in flight: its turns were recorded before w1 went down

    # nothing lost, nothing trained twice: every completed rollout trained, at one step, in a whole group
    completed = set(rows) - failed
    assert all(ran[i]["node"] == w2.address for i in completed)
    trained = {i for i, row in rows.items() if row["trained_step"] is not None}
    assert trained == completed
    groups: dict[tuple[int, str], list[str]] = defaultdict(list)
    for i in trained:
        groups[(rows[i]["trained_step"], rows[i]["group_id"])].append(i)
    assert Counter(step for step, _ in groups) == {step: batch for step in range(steps)}
    assert all(len(members) == group_size for members in groups.values()), groups
    assert {rows[i]["group_id"] for i in failed} <= {group for _, group in groups}  # made whole on w2
    with sqlite3.connect(run_dir / "trajectories.db") as conn:
        for i in trained:  # each trained rollout's turns belong to its own task
            prompt = conn.execute("SELECT prompt FROM tasks WHERE id = ?", (rows[i]["task_id"],)).fetchone()[0]
            turns = conn.execute("SELECT messages FROM turns WHERE rollout_id = ?", (i,)).fetchall()
            assert turns and all(key_of(prompt) in json.loads(m)[0]["content"] for (m,) in turns)
    result = json.loads((run_dir / "result.json").read_text())
    assert len(result["steps"]) == steps
    assert sum(s["failures/rollouts_failed"] for s in result["steps"]) == len(failed)


def test_a_runtime_on_another_host_trains_through_the_coordinators_public_address(network, hosts, tmp_path,
                                                                                  tiny_model_dir):
    """``mtrl train --agent ARN`` on ``head``; the runtime, on ``agentcore``, calls back ``coordinator_url``."""
    head = network.hosts["head"]
    wait_for_line(hosts.standin, "ready")
    rows = [{"id": f"q{n}", "prompt": f"question {n}", "ground_truth": 42} for n in range(2)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    config = {"core": {"engine": "scripted", "model": str(tiny_model_dir), "run_dir": str(run_dir), "group_size": 2,
                       "train_batch_size": 2, "max_steps": 1, "val_every": 0, "max_turns": 2, "pass_k_values": [1, 2],
                       "lora_rank": 4, "lora_alpha": 8, "sampling_params": {"max_tokens": 16}},
              "advanced": {"engine_options": {"script": ["ANSWER 42"]}, "rollout_timeout_s": 60,
                           "checkpoint_every": 0,
                           "server": {"host": head.address, "port": PORT, "api_key": API_KEY},
                           # by name, as a user's hosts know each other (each host's /etc/hosts)
                           "agentcore": {"endpoint_url": f"http://agentcore:{STANDIN_PORT}",
                                         "coordinator_url": f"http://head:{PORT}"}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = network.run(head, [PYTHON, "-m", "mtrl_runtime.cli", "train", str(tmp_path / "config.yaml"), "--agent", ARN,
                             "--dataset", str(tmp_path / "tasks.jsonl"), "--no-mlflow"],
                      env=host_env(**AWS_TEST_CREDENTIALS), timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "trained steps 1..1" in out.stdout, out.stdout[-3000:]
    network.stop_host(network.hosts["agentcore"])  # the stand-in writes the calls it answered as it stops
    calls = [json.loads(line) for line in hosts.standin_calls.read_text().splitlines()]
    invoked = [c for c in calls if c["operation"] == "InvokeAgentRuntime"]
    assert len(invoked) == 4 and all(c["status"] == 200 and c["auth"] == "sigv4" and c["arn"] == ARN for c in invoked)
    assert len({c["session_id"] for c in invoked}) == 4  # one runtime session per rollout
    # the runtime's model calls crossed the switch: the coordinator listens on head's address only
    with sqlite3.connect(run_dir / "trajectories.db") as conn:
        got = conn.execute("SELECT status, reward, (SELECT count(*) FROM turns t WHERE t.rollout_id = r.id) "
                           "FROM rollouts r").fetchall()
    assert sorted(got) == [("completed", 1.0, 1)] * 4  # each answered "ANSWER 42" and the runtime scored it


def test_without_the_rights_to_make_namespaces_the_reason_is_named():
    """What the skip says where namespaces cannot be made: checked by asking as an unprivileged user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to ask as an unprivileged user")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-c",
                          "import _netns; print(_netns.namespaces_problem())"],
                         capture_output=True, text=True, timeout=60, cwd=TESTS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cannot create a network namespace (needs root or CAP_NET_ADMIN): "), out.stdout
