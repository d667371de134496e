"""``rollouts.run_to_stop``: the first Ctrl-C stops the run, and a second one while it stops does not cut it short.

Under ``asyncio.run`` the second raised ``KeyboardInterrupt`` out of the
event loop: a stopping ``mtrl eval`` never wrote its rollouts' ends (left
``running``) and its engine thread, inside torch at the interpreter's exit,
aborted the process. Here the run is a small script whose stop waits for the
test (a line on its stdin), so the second signal lands inside the stop.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """\
import asyncio, sys
from mtrl_runtime.cli._stopping import stop_on_sigterm
from mtrl_runtime.rollouts import run_to_stop

async def run():
    try:
        print("running", flush=True)
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        print("stopping", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the stop's writes: done when the test says so
        print("stopped", flush=True)
        raise

try:
    with stop_on_sigterm():  # as mtrl train and mtrl eval run: SIGTERM does what Ctrl-C does
        run_to_stop(run())
except KeyboardInterrupt:
    sys.exit(130)
"""


def _started(tmp_path: Path, ctrl_c: signal.Handlers) -> subprocess.Popen:
    """SCRIPT running in a process whose SIGINT disposition is ``ctrl_c`` (a terminal's default, or a job's ignore)."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "run.py").write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(tmp_path / "run.py")], cwd=root, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, ctrl_c),
                            env={**os.environ, "PYTHONPATH": str(root)})


def _line(stream, timeout_s: float = 30) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return stream.readline() if ready else f"[nothing within {timeout_s} s]"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c-twice", "ctrl-c-then-sigterm"])
def test_a_second_signal_while_the_run_stops_is_said_and_the_stop_finishes(tmp_path: Path, second: int) -> None:
    proc = _started(tmp_path, signal.SIG_DFL)
    try:
        assert _line(proc.stdout) == "running\n"
        proc.send_signal(signal.SIGINT)
        assert _line(proc.stdout) == "stopping\n"
        proc.send_signal(second)
        said = _line(proc.stderr)
        assert said.startswith("mtrl: already stopping: the rollouts in flight are being recorded as interrupted"), said
        assert f"kill -KILL {proc.pid}" in said, said
        out, err = proc.communicate("done\n", timeout=30)
    finally:
        proc.kill()
    assert out == "stopped\n", (out, err)
    assert proc.returncode == 130, (proc.returncode, err)


@pytest.mark.timeout(60)
def test_where_ctrl_c_is_ignored_sigterm_cancels_the_run_and_a_second_one_does_not_cut_its_stop_short(
        tmp_path: Path) -> None:
    """A script's background job starts with Ctrl-C ignored, so ``asyncio.run`` installs no handler: SIGTERM (the
    CLI's ``sigterm_as_ctrl_c``) cancels the run's main task, whose stop runs as written; a second SIGTERM is said.
    Before, the first raised KeyboardInterrupt wherever the main thread was, and the second cut the stop short."""
    proc = _started(tmp_path, signal.SIG_IGN)
    try:
        assert _line(proc.stdout) == "running\n"
        proc.send_signal(signal.SIGINT)  # ignored, as the process was started
        proc.send_signal(signal.SIGTERM)
        assert _line(proc.stdout) == "stopping\n"
        proc.send_signal(signal.SIGTERM)
        said = _line(proc.stderr)
        while said.startswith("mtrl: Ctrl-C (SIGINT) is ignored"):  # stop_on_sigterm's note, printed at the start
            said = _line(proc.stderr)
        assert said.startswith("mtrl: already stopping: the rollouts in flight are being recorded as interrupted"), said
        out, err = proc.communicate("done\n", timeout=30)
    finally:
        proc.kill()
    assert out == "stopped\n", (out, err)
    assert proc.returncode == 130, (proc.returncode, err)
