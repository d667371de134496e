"""A run keeps one long-lived torch thread (``torch_support``): torch work elsewhere goes on a thread that
ends with it, so no second OpenMP team outlives it and throttles the engine (2x slower decode steps).

torch's CPU ops start an OpenMP team in each thread that runs one, and the
team's threads live as long as that thread. These tests count the process's
OS threads that are not Python threads (``/proc/self/task``): that count
grows by one for each live two-thread team. Each runs in a fresh process
with 2 torch threads, where nothing else holds a team.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import _lookup_task as lookup
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.torch_support import on_own_thread

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
TESTS = Path(__file__).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}

_COUNT = """
import os, threading, time

def native_threads(settle_s=5.0):
    # OS threads that are not Python threads: the live OpenMP teams' workers (polled: a team ends just after
    # its thread does)
    deadline = time.monotonic() + settle_s
    while True:
        count = len(os.listdir("/proc/self/task")) - threading.active_count()
        if count <= 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.05)
"""

_HELPER = _COUNT + """
import asyncio, torch
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.torch_support import on_own_thread
torch.set_num_threads(2)

def work():
    return float(torch.ones(1 << 20).exp_().sum())

async def main():
    before = native_threads()
    await on_own_thread(work)
    own = native_threads()
    await asyncio.to_thread(work)  # asyncio's pool keeps its thread, and so its team
    pool = native_threads(settle_s=0.5)
    print("COUNTS", before, own, pool)

asyncio.run(main())
"""

_TRAIN = """
import ctypes, os, sys, threading, time, yaml, torch
sys.path.insert(0, sys.argv[2])
import _lookup_task as lookup
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.training import MultiTurnRLTrainer
torch.set_num_threads(2)

# Linux names a new thread after the thread that created it: name each Python thread's OS thread after it,
# and an OpenMP team's workers carry the name of the thread the team belongs to
libc = ctypes.CDLL(None)
def os_name(name):
    libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
run = threading.Thread.run
def named_run(self):
    os_name(self.name)
    return run(self)
threading.Thread.run = named_run
os_name("MainThread")  # after torch's own threads (named "python") started

def teams(report):
    # the Python threads whose OpenMP team is alive now: the names of the OS threads that are not Python
    # threads, for the Python threads named above (polled: a team ends just after its thread does)
    deadline = time.monotonic() + 1.0
    while True:
        names = {t.name[:15] for t in threading.enumerate()} | {"MainThread"}
        python = {t.native_id for t in threading.enumerate()}
        found = []
        for tid in os.listdir("/proc/self/task"):
            try:
                comm = open(f"/proc/self/task/{tid}/comm").read().strip()
            except OSError:  # the thread ended
                continue
            if int(tid) not in python and comm in names:
                found.append(comm)
        if len(found) <= 1 or time.monotonic() > deadline:
            seen.append(",".join(sorted(found)))
            return
        time.sleep(0.05)

seen = []
MultiTurnRLTrainer(agent_env=lookup.agent, training_dataset=lookup.tasks(),
                   config=MtrlConfig.from_dict(yaml.safe_load(open(sys.argv[1]))), tracking=False,
                   ).train(progress=False, on_step=teams)
print("TEAMS", *seen)
"""


# After the engine is built, does the main thread already hold an OpenMP team? A parallel op starts one (a new
# OS thread) only where the thread had none. "main" first runs the probe on the main thread, as the engine did
# before: the check must see that team.
_PROBE = """
import os, sys, torch
torch.set_num_threads(2)
from mtrl_runtime.engines import HFEngine
from mtrl_runtime.engines.hf._packed_linear import packing_plan

def main_thread_has_team():
    before = len(os.listdir("/proc/self/task"))
    torch.ones(1 << 20).exp_()
    return len(os.listdir("/proc/self/task")) == before

engine = HFEngine(sys.argv[1], dtype="fp32", num_threads=2, cpu_linear="auto")
if sys.argv[2] == "main":
    packing_plan(engine.model)
print("TEAM", main_thread_has_team(), engine.cpu_linear)
"""


def _printed(script: str, tag: str, *args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=240, env=ENV)
    line = [x for x in out.stdout.splitlines() if x.startswith(tag)]
    assert out.returncode == 0 and line, out.stderr[-3000:]
    return line[0].split()[1:]


def test_work_on_its_own_thread_leaves_no_team_where_asyncio_s_pool_keeps_one():
    before, own, pool = map(int, _printed(_HELPER, "COUNTS"))
    assert own == before, "the thread's OpenMP team ended with it"
    assert pool == before + 1, "the control: a pool thread that ran torch keeps its team (2 threads: 1 more)"


def test_a_training_run_holds_one_openmp_team_the_engine_s(tmp_path):
    """Building the run (the policy; the update's head probe runs a forward) ran on asyncio's pool: its team
    lived through the run beside the engine worker's, and every decode step and update ran throttled."""
    model = lookup.save_model(tmp_path / "model")
    cfg = lookup.config(tmp_path / "run", model=str(model), engine="hf", max_steps=2,
                        advanced={"engine_options": {"eos_token_ids": lookup.stop_ids(lookup.build_tokenizer())}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    teams = _printed(_TRAIN, "TEAMS", str(tmp_path / "config.yaml"), str(TESTS))
    assert teams == ["mtrl-hf-engine"] * 2, f"at each step, the one thread with a team is the engine's: {teams}"


def test_on_own_thread_returns_raises_and_sees_the_caller_s_context():
    flag = contextvars.ContextVar("flag", default="unset")

    async def main():
        flag.set("caller")
        got = await on_own_thread(lambda: flag.get())
        with pytest.raises(ValueError, match="bad value"):
            await on_own_thread(_raise)
        return got

    assert asyncio.run(main()) == "caller"


def _raise() -> None:
    raise ValueError("bad value")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN: no probe")
def test_the_engine_probes_on_its_worker_so_the_main_thread_starts_no_openmp_team(tmp_path):
    """The packing probe's matmuls on the constructing thread gave it an OpenMP team for good, and with two
    teams libgomp throttles: every decode step after it ran 2.5x slower (192 against 77 ms, SmolLM2 bf16)."""
    tok = tiny_tokenizer()
    tiny_model(tok, hidden_size=512).save_pretrained(tmp_path / "model")  # large enough for 2-thread matmuls
    tok.save_pretrained(tmp_path / "model")
    seen = {where: _printed(_PROBE, "TEAM", str(tmp_path / "model"), where)[0] for where in ("worker", "main")}
    assert seen == {"worker": "False", "main": "True"}, seen
