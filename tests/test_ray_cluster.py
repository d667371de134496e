"""Rollouts on a Ray cluster of several nodes, the coordinator reached over a non-loopback address with a key.

The cluster is three ``ray start --block`` processes on loopback, as on
three machines: a head with no CPUs (so it runs no rollout) and two worker
nodes that join it with ``--address``. The coordinator binds this
machine's non-loopback address with an API key, as it must for agents on
other hosts, and the driver joins the cluster by its address. Every rollout
must run on a worker node (each writes the node it ran on), both worker
nodes must take rollouts, and every turn and tool call must be recorded for
its own task. Each node is stopped by its own process id at the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from _adapter_support import check_attribution, policy, specs, tasks
from _groups import processes
from _ray_agents import node_agent
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import RayExecutor, endpoint_problem
from mtrl_runtime.rollouts import Dispatcher
from mtrl_runtime.server import create_app, start_server
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import RolloutStatus, Task

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
pytestmark = [pytest.mark.timeout(600), processes]  # never beside another cluster or torchrun job
TESTS = Path(__file__).resolve().parent
RAY = Path(sys.executable).with_name("ray")
API_KEY = "cluster-test-key"


def outward_address() -> str | None:
    """An IPv4 address of this machine other than loopback (what another host would connect to)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family.name == "AF_INET" and not address.address.startswith("127."):
                return address.address
    return None


def start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``ray start --block ...``: the node runs while this process does; SIGTERM stops the node's processes."""
    node = subprocess.Popen([str(RAY), "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                             *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    node.log_path = log  # type: ignore[attr-defined]
    return node


HEAD_ADDRESS = re.compile(r"ray start --address='(?P<address>[\d.]+:\d+)'")  # how `ray start --head` says it


def head_address(head: subprocess.Popen, timeout: float = 180) -> str:
    """The address a head started with ``--port=0`` took, read from the line its log tells other nodes to join by."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = Path(head.log_path).read_text()  # type: ignore[attr-defined]
        if match := HEAD_ADDRESS.search(log):
            return match["address"]
        if head.poll() is not None:
            raise RuntimeError(f"the ray head exited early with {head.returncode}:\n{log[-3000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"the ray head printed no address to join in {timeout} s")


def wait_for_nodes(address: str, env: dict[str, str], count: int, nodes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 180
    script = ("import ray, json; ray.init(address=%r, log_to_driver=False); "
              "print(json.dumps(sum(1 for n in ray.nodes() if n['Alive'])))" % address)
    while time.monotonic() < deadline:
        for node in nodes:
            if node.poll() is not None:
                log = Path(node.log_path).read_text()[-3000:]  # type: ignore[attr-defined]
                raise RuntimeError(f"a ray node exited early with {node.returncode}: {node.args}\n{log}")
        try:
            out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:  # a driver that cannot join yet (or a node that died): look again
            continue
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(2)
    raise TimeoutError(f"the Ray cluster at {address} did not reach {count} nodes in 180 s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, ray_temp_dir: Path) -> Iterator[str]:
    """A head (0 CPUs) and two worker nodes (2 CPUs each) on loopback; yields the head's address."""
    root = tmp_path_factory.mktemp("raycluster")  # the nodes' logs; Ray's own files in the short ray_temp_dir
    python_path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": python_path, "TOKENIZERS_PARALLELISM": "false"}
    # --port=0: the head takes a free port and prints it (a port picked here could be taken in between)
    nodes = [start_node(["--port=0", "--head", "--num-cpus=0", f"--temp-dir={ray_temp_dir}",
                         "--include-dashboard=false"], env, root / "head.log")]
    try:
        address = head_address(nodes[0])
        wait_for_nodes(address, env, 1, nodes)
        for i in range(2):  # one at a time: two raylets starting at once on a busy machine can time out
            nodes.append(start_node([f"--address={address}", "--num-cpus=2"], env, root / f"worker{i}.log"))
            wait_for_nodes(address, env, 2 + i, nodes)
        yield address
    finally:
        # each `ray start --block` stops the processes of its own node on SIGTERM, gracefully (up to ~30 s);
        # the cluster is the test's own, so after a short grace its process groups are killed outright
        for node in reversed(nodes):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for node in nodes:
            try:
                node.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # the grace is over: the kill below ends the node
                pass
        for node in nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)  # what is left of the node: raylet, GCS, workers
            except ProcessLookupError:  # the node's group has already exited: nothing is left to kill
                pass
            node.wait(timeout=30)


@pytest.fixture()
def remote_coordinator(tmp_path: Path) -> Iterator[Any]:
    """A coordinator bound to this machine's non-loopback address, with an API key."""
    host = outward_address()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address to bind the coordinator to")
    config = MtrlConfig.from_dict({"advanced": {"server": {"host": host, "api_key": API_KEY},
                                                "rollout_timeout_s": 120}})
    store = SQLiteStore(tmp_path / "store.db")
    coordinator = Coordinator(ScriptedEngine(_tokenizer(), policy), store, config)
    handle = start_server(create_app(coordinator), host, 0, API_KEY)
    handle.coordinator, handle.store, handle.config = coordinator, store, config  # type: ignore[attr-defined]
    try:
        yield handle
    finally:
        handle.stop()
        store.close()


def _tokenizer() -> Any:
    from mtrl_runtime.testing import tiny_tokenizer

    return tiny_tokenizer()


async def test_rollouts_land_on_the_worker_nodes_and_reach_the_coordinator_by_its_address(
    cluster, remote_coordinator, tmp_path, monkeypatch
):
    handle = remote_coordinator
    assert not handle.url.startswith("http://127.") and handle.url.startswith("http://")
    # beyond loopback, opening a rollout over HTTP needs the key; the rollout's URL is the bind address
    body = {"task_id": "probe", "prompt": "What is the value of key K00 plus 5?"}
    assert httpx.post(f"{handle.url}/v1/rollouts", json=body, timeout=10).status_code == 401
    wrong = httpx.post(f"{handle.url}/v1/rollouts", json=body, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    opened = httpx.post(f"{handle.url}/v1/rollouts", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                        timeout=10)
    assert opened.status_code == 200 and opened.json()["base_url"].startswith(handle.url), opened.text

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    work = [Task(id=t.id, prompt=t.prompt, data={"node_file": str(tmp_path / f"{t.id}.node")})
            for t in tasks(8) if t.id not in ("t03", "t05")]  # no tool error, no crash: plain episodes
    executor = RayExecutor(node_agent, address=cluster, num_cpus=1,
                           init_options={"log_to_driver": False},
                           remote_options={"scheduling_strategy": "SPREAD"})
    try:
        assert executor.owns_ray
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        workers = {i for i, n in nodes.items() if n["Resources"].get("CPU", 0) > 0}
        assert len(nodes) == 3 and len(workers) == 2
        # an endpoint a worker cannot reach is refused before any rollout runs there
        probe = Task(id="wildcard-probe", prompt=work[0].prompt)
        wildcard = replace(specs(handle, [probe])[0], endpoint=handle.url.replace(outward_address(), "0.0.0.0"))
        with pytest.raises(ValueError, match="wildcard address, which a Ray worker reads as its own machine"):
            await executor.run(wildcard)
        dispatcher = Dispatcher(handle.coordinator, executor, handle.config.with_overrides({"core.group_size": 1}),
                                handle.url, handle.loop)
        batch = await dispatcher.collect(0, work)
    finally:
        await executor.close()
    assert not ray.is_initialized()
    ran_on = {task.id: (tmp_path / f"{task.id}.node").read_text() for task in work}
    assert set(ran_on.values()) == workers, (ran_on, workers)  # every rollout on a worker node, both used
    finished = [r for g in batch.groups for r in g.finished]
    assert len(finished) == len(work)
    for rollout in finished:
        assert rollout.status is RolloutStatus.COMPLETED, rollout.error
        spec_task = next(t for t in work if t.id == rollout.task_id)
        check_attribution(handle.store, _Spec(rollout.id, spec_task))


class _Spec:
    """What ``check_attribution`` reads of a spec: the rollout id and its task."""

    def __init__(self, rollout_id: str, task: Task) -> None:
        self.rollout_id, self.task = rollout_id, task


def test_an_endpoint_workers_on_other_machines_cannot_reach_is_named_with_the_fix():
    here = outward_address() or "127.0.0.1"
    assert "wildcard address" in endpoint_problem("http://0.0.0.0:8731", {"127.0.0.1"})
    problem = endpoint_problem("http://127.0.0.1:8731", {"127.0.0.1", "203.0.113.7"})
    assert "loopback address, and Ray nodes on other machines (203.0.113.7) cannot reach it" in problem
    assert "advanced.server.host" in problem and "advanced.server.api_key" in problem
    assert endpoint_problem("http://127.0.0.1:8731", {"127.0.0.1", here}) is None  # one machine: fine
    assert endpoint_problem("http://10.0.0.1:8731", {"127.0.0.1", "203.0.113.7"}) is None
    assert endpoint_problem("http://head.internal:8731", {"203.0.113.7"}) is None  # a name: resolved on each node
