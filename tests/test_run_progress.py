"""Progress a person can follow, and stopping by hand: ``mtrl train`` as a real subprocess on the scripted engine.

The run is not on a terminal, so it prints plain lines: a start line, a
heartbeat during each step (here every 0.2 s instead of 30 s), a line per
step. SIGINT (Ctrl-C) or SIGTERM in the middle of a step ends the rollouts
in flight as ``interrupted`` in the store (the coordinator's state machine
decides it from ``RunStopped``), the run says how to resume, and
``--resume`` trains the interrupted step again from the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mtrl_runtime.types import RolloutStatus

AGENT = Path(__file__).resolve().parent / "_collect_agent.py"
STEPS = 6  # of the stopped run: ~5 s a step, so a test that reads its output late still stops it mid-run
SCRIPT = """\
tasks:
  - replies:
      - {tool_call: {name: lookup, arguments: {key: A1}}, delay_s: 2.5}
      - {text: "ANSWER 42", delay_s: 2.5}
"""


def _inputs(tmp_path: Path, model_dir: Path) -> list[str]:
    (tmp_path / "script.yaml").write_text(SCRIPT)
    cfg = {"core": {"engine": "scripted", "model": str(model_dir), "run_dir": str(tmp_path / "run"),
                    "group_size": 2, "train_batch_size": 2, "max_turns": 4, "max_steps": 2, "lora_rank": 4,
                    "lora_alpha": 8},
           "advanced": {"rollout_timeout_s": 60, "checkpoint_every": 1,
                        "engine_options": {"script_file": str(tmp_path / "script.yaml")}}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"id": f"t{i}", "prompt": f"What is the value under A1? ({i})"} for i in range(4)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["train", str(tmp_path / "cfg.yaml"), "--agent", f"{AGENT}:agent",
            "--dataset", str(tmp_path / "tasks.jsonl"), "--no-mlflow", "--heartbeat", "0.2"]


def _signal_state() -> str:
    """This process's blocked and ignored signal masks (``/proc/self/status``): what a child inherits."""
    text = Path("/proc/self/status").read_text() if Path("/proc/self/status").is_file() else ""
    return ", ".join(line.replace("\t", " ") for line in text.splitlines() if line.startswith(("SigBlk", "SigIgn")))


def _ends_with_the_test_worker() -> None:
    """In the child before exec: killed when the worker that started it dies (Linux's ``PR_SET_PDEATHSIG``), so
    that a test run killed mid-test leaves no ``mtrl train`` behind training on the machine's cores."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _as_a_shell_starts_it() -> None:
    """In the child before exec: SIGINT handled by default and not blocked, as a terminal starts a command.
    A test worker may carry either from an earlier test's library, and a child inherits both."""
    _ends_with_the_test_worker()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _as_a_scripts_background_job_starts_it() -> None:
    """In the child before exec: SIGINT ignored, as a non-interactive shell starts ``mtrl train ... &``."""
    _ends_with_the_test_worker()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(args: list[str], cwd: Path, preexec=_as_a_shell_starts_it) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "mtrl_runtime.cli", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=preexec,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    proc.worker_signals = _signal_state()  # type: ignore[attr-defined]
    return proc


def _read_until(proc: subprocess.Popen, marker: str, seen: list[str], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if marker in line:
            return
    proc.kill()
    raise AssertionError(f"no line with {marker!r}; output:\n" + "\n".join(seen[-60:]))


def _stop_in_step(proc: subprocess.Popen, step: int, max_steps: int, stop: int) -> tuple[list[str], str]:
    """Wait for step ``step`` (1-based) to be trained and the next one's rollouts to be in flight, then ``stop``."""
    seen: list[str] = []
    _read_until(proc, f"step {step}/{max_steps}  reward 1.000", seen)  # trained and checkpointed
    # a second into the next step: its rollouts are created and in their first turn (2.5 s per turn)
    _read_until(proc, f"step {step + 1}/{max_steps}: rollouts 0/4 done, turns 0, tool calls 0, errors 0 (1 s)", seen)
    # send_signal does nothing to a process that has ended: say so, rather than blame the run for ignoring it
    assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before the test sent its signal"
    sent = time.monotonic()
    proc.send_signal(stop)
    try:
        rest, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # killed, so that a failing test leaves no run behind (it was left hung)
        proc.kill()
        rest, _ = proc.communicate()
        raise AssertionError(f"the run had not ended 120 s after signal {stop} (sent at '{seen[-1]}'): killed; "
                             f"output after it:\n{rest[-4000:]}") from None
    # for a failure's message: a run that ignored the signal takes its remaining steps (~5 s each) to end;
    # one that had already ended them before the test read its output ends at once
    rest += (f"\n[test: signal {stop} sent at '{seen[-1]}'; the process ended {time.monotonic() - sent:.1f} s later; "
             f"the test worker's signals: {proc.worker_signals}]")
    return seen, rest


def _by_status(run_dir: Path) -> dict[RolloutStatus, list]:
    from mtrl_runtime.store import open_store

    store = open_store(run_dir / "trajectories.db")
    try:
        return {s: store.rollouts(status=s, with_turns=False) for s in RolloutStatus} | {
            "resumes": store.get_meta("resumes", [])}
    finally:
        store.close()


@pytest.mark.timeout(420)
def test_a_stopped_run_marks_its_rollouts_interrupted_says_how_to_resume_and_resumes(tmp_path, tiny_model_dir):
    args = _inputs(tmp_path, tiny_model_dir)
    # Ctrl-C while step 2 collects; the run has steps enough left that it cannot end before the signal arrives
    proc = _start([*args, "--max-steps", str(STEPS)], tmp_path)
    seen, rest = _stop_in_step(proc, 1, STEPS, signal.SIGINT)
    out = "\n".join(seen) + "\n" + rest
    assert proc.returncode == 130, out
    assert "Ctrl-C (SIGINT) is" not in out, out  # started as a terminal starts it: Ctrl-C works, nothing to say

    start = next(line for line in seen if line.startswith("mtrl: training "))
    assert "engine scripted" in start and f"run folder {tmp_path / 'run'}" in start and "MLflow off" in start, start
    assert f"from step 1 of {STEPS}" in start and "script.yaml" in start, start
    beats = [line for line in seen if line.startswith(f"step 1/{STEPS}: rollouts ")]
    assert beats and "turns" in beats[-1] and "tool calls" in beats[-1] and "errors 0" in beats[-1], out
    done = [int(line.split("rollouts ")[1].split("/")[0]) for line in beats]
    assert done == sorted(done) and done[-1] <= 4 and all("/4 done, turns " in line for line in beats), out
    step = next(line for line in seen if line.startswith(f"step 1/{STEPS}  reward"))
    assert " rollouts " in step and " update " in step, step
    assert "mtrl: stopped; 4 rollouts in flight were marked interrupted" in rest, out
    resume = next(line for line in rest.splitlines() if "resume from" in line)
    assert "checkpoints/step-000001 with: mtrl train " in resume and resume.endswith(" --resume"), resume
    assert f"--max-steps {STEPS}" in resume, resume

    stored = _by_status(tmp_path / "run")
    assert stored[RolloutStatus.RUNNING] == []
    interrupted = stored[RolloutStatus.INTERRUPTED]
    assert len(interrupted) == 4 and {r.step for r in interrupted} == {1}, out
    assert all("cancelled" in r.error for r in interrupted)
    assert len(stored[RolloutStatus.COMPLETED]) == 4  # step 0's

    # --resume: step 2 is trained again from the checkpoint (the interrupted rollouts are not reused);
    # started as a script's background job (Ctrl-C ignored), the run says so and names SIGTERM, which,
    # sent while step 3 collects, does what Ctrl-C does
    proc = _start([*args, "--max-steps", str(STEPS), "--resume"], tmp_path, _as_a_scripts_background_job_starts_it)
    seen, rest = _stop_in_step(proc, 2, STEPS, signal.SIGTERM)
    out = "\n".join(seen) + "\n" + rest
    assert proc.returncode == 130, out
    assert "mtrl: Ctrl-C (SIGINT) is ignored in this process" in out, out
    assert f"stop the run with: kill -TERM {proc.pid}" in out, out
    assert any(f"from step 2 of {STEPS}" in line for line in seen), out
    assert "mtrl: stopped; 4 rollouts in flight were marked interrupted" in rest, out
    assert "checkpoints/step-000002 with: mtrl train " in rest, out

    stored = _by_status(tmp_path / "run")
    assert stored[RolloutStatus.RUNNING] == []
    assert sorted(r.step for r in stored[RolloutStatus.INTERRUPTED]) == [1] * 4 + [2] * 4
    assert sorted(r.step for r in stored[RolloutStatus.COMPLETED]) == [0] * 4 + [1] * 4
    [record] = stored["resumes"]
    assert record["start_step"] == 1 and record["interrupted"] == [] and record["reused"] == []  # none left running


def test_mtrl_eval_prints_a_start_line_and_heartbeats(tmp_path, tiny_model_dir, capsys):
    from mtrl_runtime.cli import main

    args = _inputs(tmp_path, tiny_model_dir)
    cfg, data = args[1], args[5]
    assert main(["eval", cfg, "--agent", f"{AGENT}:agent", "--dataset", data, "--max-tasks", "2", "--samples", "2",
                 "--no-mlflow", "--heartbeat", "0.2"]) == 0
    err = capsys.readouterr().err
    start = next(line for line in err.splitlines() if line.startswith("mtrl: evaluating "))
    assert "script.yaml" in start and "engine scripted" in start and "MLflow off" in start, err
    assert "rollouts 2 tasks x 2 samples x 1 side(s)" in start, start
    beats = [line for line in err.splitlines() if line.startswith("evaluation: rollouts ")]
    assert beats and all("/4 done, turns " in line and ", tool calls " in line for line in beats), err
    counts = [int(line.split("rollouts ")[1].split("/")[0]) for line in beats]
    assert counts == sorted(counts) and max(counts) <= 4, err


def test_on_a_terminal_the_heartbeat_is_the_live_bars_status(monkeypatch):
    import asyncio
    import io

    from rich.console import Console

    from mtrl_runtime.coordinator import CoordinatorCounters
    from mtrl_runtime.rollouts import RolloutTally
    from mtrl_runtime.training import _progress
    from mtrl_runtime.training._loop import StepReport

    monkeypatch.setattr(_progress, "TTY_REFRESH_S", 0.05)
    screen = io.StringIO()
    tally, counters = RolloutTally(), CoordinatorCounters()
    counters.count_turns(None, 3)  # before the run: not a step's
    counters.count_tool_calls(None, 1)

    async def run() -> list[str]:
        statuses = []
        with _progress.ProgressDisplay(3, console=Console(file=screen, force_terminal=True, width=200)) as display:
            display.attach({"training": "m", "engine": "scripted"}, tally, counters, 0)
            tally.plan(0, 4)
            tally.record(0, RolloutStatus.COMPLETED)
            tally.record(0, RolloutStatus.FAILED)
            counters.count_turns(0, 5)
            await asyncio.sleep(0.3)
            statuses.append(display._progress.tasks[0].fields["status"])
            display(StepReport(0, 3, {"rollout/reward/mean": 0.5, "time/step": 1.0}))
            tally.plan(1, 4)
            await asyncio.sleep(0.3)
            statuses.append(display._progress.tasks[0].fields["status"])
        return statuses

    first, second = asyncio.run(run())
    assert first.startswith("step 1/3: rollouts 2/4 done, turns 5, tool calls 0, errors 1"), first
    assert second.startswith("step 2/3: rollouts 0/4 done, turns 0"), second
    assert "mtrl: training m, engine scripted" in screen.getvalue()


def test_a_steps_heartbeat_counts_the_turns_of_its_rollouts_collected_before_its_mark(served, tiny_tok):
    """Asynchronous training collects a step's rollouts while the step before it trains: by the step's mark they
    may all be done. Its line counts their turns and tool calls (it read "rollouts 2/2 done, turns 0")."""
    import asyncio

    import openai

    from mtrl_adapters import aupdate_reward, record_tool_call, rollout
    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.executors import InProcessExecutor
    from mtrl_runtime.rollouts import Dispatcher, Heartbeat
    from mtrl_runtime.types import Task

    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"))

    @rollout
    async def agent(task):
        client = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}],
                                             max_tokens=4)
        record_tool_call("lookup", {"key": "A1"}, result="42")
        await aupdate_reward(1.0)

    async def collect() -> tuple[str, str]:
        executor = InProcessExecutor(agent)
        dispatcher = Dispatcher(handle.coordinator, executor, MtrlConfig.from_dict({"core": {"group_size": 2}}),
                                handle.url, handle.loop)
        beat = Heartbeat(dispatcher.tally, handle.coordinator.counters, lambda line: None)
        beat.mark("step 1/2", key=0)
        try:
            await dispatcher.collect(1, [Task(id="t", prompt="q")])  # step 2's rollouts, ahead of its mark
        finally:
            await executor.close()
        during = beat.line()
        beat.mark("step 2/2", key=1)
        return during, beat.line()

    during, marked = asyncio.run(collect())
    assert during.startswith("step 1/2: rollouts 0/0 done, turns 0, tool calls 0"), during
    assert marked.startswith("step 2/2: rollouts 2/2 done, turns 2, tool calls 2, errors 0"), marked


def test_a_process_started_with_ctrl_c_blocked_says_so_and_sigterm_still_reaches_it():
    """SIGINT ignored or blocked as the process started: the note names it and the pid; a blocked SIGTERM is unblocked
    inside ``stop_on_sigterm`` (else only SIGKILL could stop the run) and blocked again after."""
    from mtrl_runtime.cli._stopping import ctrl_c_note, stop_on_sigterm

    said: list[str] = []
    # SIGINT as Python starts it; an earlier test in this worker may have left it ignored (seen in a full run)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    old = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        assert ctrl_c_note(123) is None  # handled and not blocked: nothing to say
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert ctrl_c_note(123).startswith("mtrl: Ctrl-C (SIGINT) is ignored in this process")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        assert ctrl_c_note(123) == ("mtrl: Ctrl-C (SIGINT) is blocked in this process, as the program that "
                                    "started it left it; stop the run with: kill -TERM 123")
        with stop_on_sigterm(said.append):
            inside = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        signal.signal(signal.SIGINT, handler)
    assert said == [f"mtrl: Ctrl-C (SIGINT) is blocked in this process, as the program that started it left it; "
                    f"stop the run with: kill -TERM {os.getpid()}"]
    assert signal.SIGTERM not in inside and signal.SIGINT in inside
    assert {signal.SIGTERM, signal.SIGINT} <= after


# -- stopped while the hf engine generates ----------------------------------------------------------------------
# Greedy decoding of the tiny model never samples its end token, so every call generates all of max_tokens (3500:
# a minute and more per batch on 2 CPU cores); a stop that waited for the calls in flight would take that long.
HF_MAX_TOKENS = 3500
STOP_BOUND_S = 30  # from the signal to the process's end; the generations in flight would take minutes


def _hf_inputs(tmp_path: Path, model_dir: Path) -> list[str]:
    sampling = {"max_tokens": HF_MAX_TOKENS, "temperature": 0.0}
    cfg = {"core": {"engine": "hf", "model": str(model_dir), "run_dir": str(tmp_path / "run"), "group_size": 2,
                    "train_batch_size": 4, "max_turns": 2, "max_steps": 2, "lora_rank": 4, "lora_alpha": 8,
                    "val_every": 0, "sampling_params": sampling, "val_sampling_params": sampling},
           "advanced": {"rollout_timeout_s": 600, "checkpoint_every": 1, "precision": "fp32"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"id": f"t{i}", "prompt": f"What is the value under A1? ({i})"} for i in range(4)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [str(tmp_path / "cfg.yaml"), "--agent", f"{AGENT}:agent", "--dataset", str(tmp_path / "tasks.jsonl"),
            "--no-mlflow", "--heartbeat", "0.2"]


def _stop_while_generating(proc: subprocess.Popen, heartbeat: str, stop: int) -> tuple[str, float]:
    """Send ``stop`` two seconds into the first turns (each of the 8 rollouts' first call generating); return the
    whole output and the seconds from the signal to the end (killed past ``STOP_BOUND_S``: then the test fails on
    the store and the status)."""
    seen: list[str] = []
    first_turns = re.compile(re.escape(f"{heartbeat}rollouts 0/8 done, turns 0, tool calls 0, errors 0 (") + r"(\d+) s\)")
    while not (seen and (m := first_turns.fullmatch(seen[-1])) and int(m.group(1)) >= 2):
        _read_until(proc, f"{heartbeat}rollouts 0/8 done, turns 0", seen)
    assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before the test sent its signal"
    sent = time.monotonic()
    proc.send_signal(stop)
    try:
        rest, _ = proc.communicate(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, _ = proc.communicate()
        rest += f"\n[test: still running {STOP_BOUND_S} s after the signal: killed]"
    took = time.monotonic() - sent
    rest += f"\n[test: signal {stop} sent at '{seen[-1]}'; the process ended {took:.1f} s later, rc {proc.returncode}]"
    return "\n".join(seen) + "\n" + rest, took


def _ended_interrupted_without_turns(db: Path, out: str) -> None:
    """Every rollout of the store at ``db`` interrupted by the stop, its call in flight not recorded (``out``: the
    run's output, for a failure's message)."""
    from mtrl_runtime.store import open_store

    store = open_store(db)
    try:
        stored = store.rollouts()
    finally:
        store.close()
    statuses = sorted((r.status.value, len(r.turns)) for r in stored)
    # each one's first call was generating: cut, not waited for and recorded
    assert statuses == [("interrupted", 0)] * 8, f"{statuses}\n{out}"
    assert all("the run stopped" in r.error for r in stored), f"{[r.error for r in stored]}\n{out}"


@pytest.mark.timeout(420)  # wall time on a loaded machine; the run itself needs ~20 s of CPU
def test_mtrl_eval_stopped_while_the_hf_engine_generates_records_every_rollout_interrupted(tmp_path, tiny_model_dir):
    # the generations in flight are cancelled, not waited for: before, the stop waited for every call to finish
    # (78 s here; minutes for SmolLM2 with 32 rollouts), and a second signal meanwhile cut it short (below)
    args = ["eval", *_hf_inputs(tmp_path, tiny_model_dir), "--max-tasks", "4", "--samples", "2"]
    proc = _start(args, tmp_path)
    out, took = _stop_while_generating(proc, "evaluation: ", signal.SIGTERM)
    store = tmp_path / "run" / "eval" / "trajectories.db"
    _ended_interrupted_without_turns(store, out)
    assert proc.returncode == 130, out
    assert took < STOP_BOUND_S, out
    assert "terminate called" not in out, out
    assert (f"mtrl: evaluation stopped; 8 rollouts in flight were marked interrupted in {store}; run the same "
            "command again to evaluate anew") in out, out


@pytest.mark.timeout(420)  # wall time on a loaded machine; the run itself needs ~20 s of CPU
def test_mtrl_train_stopped_while_the_hf_engine_generates_records_every_rollout_interrupted(tmp_path, tiny_model_dir):
    proc = _start(["train", *_hf_inputs(tmp_path, tiny_model_dir)], tmp_path)
    out, took = _stop_while_generating(proc, "step 1/2: ", signal.SIGTERM)
    store = tmp_path / "run" / "trajectories.db"
    _ended_interrupted_without_turns(store, out)
    assert proc.returncode == 130, out
    assert took < STOP_BOUND_S, out
    assert "terminate called" not in out, out
    assert f"mtrl: stopped; 8 rollouts in flight were marked interrupted in {store}" in out, out
    assert "mtrl: no checkpoint was written yet; start again with: mtrl train " in out, out


def test_train_and_eval_refuse_a_heartbeat_of_zero_and_print_what_a_stop_marked(capsys):
    """Both commands run their work through ``run_until_stopped``: ``--heartbeat`` named with its value when it is
    not > 0, the work's result when it ends, None and the stop's line on stderr when Ctrl-C (or SIGTERM) stopped it."""
    from mtrl_runtime.cli._stopping import run_until_stopped

    with pytest.raises(SystemExit, match=r"^mtrl eval: --heartbeat must be > 0 seconds, got 0$"):
        run_until_stopped("eval", 0, lambda heartbeat_s: "ran", lambda since: "stopped")
    with pytest.raises(SystemExit, match=r"^mtrl train: --heartbeat must be > 0 seconds, got -1.5$"):
        run_until_stopped("train", -1.5, lambda heartbeat_s: "ran", lambda since: "stopped")
    assert run_until_stopped("train", 0.5, lambda heartbeat_s: heartbeat_s * 4, lambda since: "never") == 2.0

    def stopped_by_hand(heartbeat_s: float) -> None:
        raise KeyboardInterrupt

    before = time.time()
    assert run_until_stopped("eval", 1, stopped_by_hand, lambda since: f"stopped; since {since >= before}") is None
    said = capsys.readouterr().err.splitlines()  # less the note of a process started with Ctrl-C ignored (a job)
    assert [line for line in said if not line.startswith("mtrl: Ctrl-C (SIGINT) is ignored")] == ["stopped; since True"]
