"""``rollouts.run_to_stop``: the first Ctrl-C stops the run, and a second one while it stops does not cut it short.

Under ``asyncio.run`` the second raised ``KeyboardInterrupt`` out of the
event loop: a stopping ``mtrl eval`` never wrote its rollouts' ends (left
``running``) and its engine thread, inside torch at the interpreter's exit,
aborted the process. Here the run is a small script whose stop waits for the
test (a line on its stdin), so the second signal lands inside the stop.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
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


class _Lines:
    """A pipe's lines as they come, read on a thread. (``select`` on the pipe, as this module did, misses a line
    that an earlier ``readline`` already pulled into the stream's buffer: under load the note and the stopping
    line arrived in one read, and the wait for the second timed out.)"""

    def __init__(self, stream) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self._queue.put(line)
        self._queue.put("")  # the end of the stream

    def next(self, timeout_s: float = 30) -> str:
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return f"[nothing within {timeout_s} s]"

    def rest(self, timeout_s: float = 30) -> str:
        """Everything up to the end of the stream."""
        lines = []
        while (line := self.next(timeout_s)) != "":
            lines.append(line)
            if line.startswith("[nothing within"):
                break
        return "".join(lines)


def _finished(proc: subprocess.Popen, out: _Lines, err: _Lines) -> tuple[str, str]:
    """The test's "done" on stdin (the stop's writes end), then the rest of stdout and stderr."""
    proc.stdin.write("done\n")
    proc.stdin.close()
    return out.rest(), err.rest()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c-twice", "ctrl-c-then-sigterm"])
def test_a_second_signal_while_the_run_stops_is_said_and_the_stop_finishes(tmp_path: Path, second: int) -> None:
    proc = _started(tmp_path, signal.SIG_DFL)
    stdout, stderr = _Lines(proc.stdout), _Lines(proc.stderr)
    try:
        assert stdout.next() == "running\n"
        proc.send_signal(signal.SIGINT)
        assert stdout.next() == "stopping\n"
        proc.send_signal(second)
        said = stderr.next()
        assert said.startswith("mtrl: already stopping: the rollouts in flight are being recorded as interrupted"), said
        assert f"kill -KILL {proc.pid}" in said, said
        out, err = _finished(proc, stdout, stderr)
        proc.wait(timeout=30)
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
    stdout, stderr = _Lines(proc.stdout), _Lines(proc.stderr)
    try:
        assert stdout.next() == "running\n"
        proc.send_signal(signal.SIGINT)  # ignored, as the process was started
        proc.send_signal(signal.SIGTERM)
        assert stdout.next() == "stopping\n"
        proc.send_signal(signal.SIGTERM)
        said = stderr.next()
        while said.startswith("mtrl: Ctrl-C (SIGINT) is ignored"):  # stop_on_sigterm's note, printed at the start
            said = stderr.next()
        assert said.startswith("mtrl: already stopping: the rollouts in flight are being recorded as interrupted"), said
        out, err = _finished(proc, stdout, stderr)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert out == "stopped\n", (out, err)
    assert proc.returncode == 130, (proc.returncode, err)
