"""tests/_preloaded_python.py and the ``mtrl`` of tests/_docs_bin: a forked child behaves as ``python SCRIPT`` would.

The server here preloads only ``json`` (the point is the process, not the
imports' cost): a child gets its own argv, folder, environment, streams and
exit status; a request with another environment is refused and runs fresh;
a child past its timeout is killed; a requester that hangs up takes its child
with it; the shim passes SIGTERM on and ends as its child ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _preloaded_python import PreloadedPython

SHIM = Path(__file__).resolve().parent / "_docs_bin" / "mtrl"
SCRIPT = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"), "path0": sys.path[0],
                  "parent": os.getppid(),
                  "preloaded": "json" in sys.modules, "stdin": sys.stdin.read()}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture
def server(tmp_path):
    with PreloadedPython(["json"], tmp_path, env={**os.environ, "X": "server"}, socket_env="MTRL_TEST_PRELOADED",
                         absent=["torch"]) as preloaded:
        yield preloaded


def test_a_child_runs_the_script_as_python_would(server, tmp_path):
    import json

    (tmp_path / "work").mkdir()
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    done = server.run(script, "a", "b c", timeout=60, cwd=tmp_path / "work")
    assert done.returncode == 0 and done.stderr == "to stderr\n", done
    seen = json.loads(done.stdout)
    assert seen["argv"] == [str(script), "a", "b c"] and seen["cwd"] == str(tmp_path / "work")
    assert seen["x"] == "server" and seen["path0"] == str(tmp_path) and seen["stdin"] == ""
    assert seen["parent"] == server.server.pid  # forked by the server
    assert server.env["MTRL_TEST_PRELOADED"] == str(server.socket)
    # the server's own environment is served by a fork; another one by a fresh process, as asked
    forked = server.run(script, timeout=60, env=dict(server.env))
    assert json.loads(forked.stdout)["parent"] == server.server.pid
    fresh = server.run(script, timeout=60, env={**server.env, "X": "other", "EXIT": "3"})
    assert fresh.returncode == 3 and json.loads(fresh.stdout)["x"] == "other"
    assert json.loads(fresh.stdout)["parent"] == os.getpid()


def test_a_child_past_its_timeout_is_killed_and_a_signal_is_its_status(server, tmp_path):
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(120)\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(tmp_path / "sleep.py", timeout=1)
    assert time.monotonic() - started < 30
    (tmp_path / "die.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert server.run(tmp_path / "die.py", timeout=60).returncode == -signal.SIGKILL
    # an uncaught error: status 1 and the traceback from the script's own frame, as a fresh python prints it
    (tmp_path / "fail.py").write_text("def f():\n    raise ValueError('no')\nf()\n")
    failed = server.run(tmp_path / "fail.py", timeout=60)
    assert failed.returncode == 1 and failed.stderr.splitlines()[:2] == [
        "Traceback (most recent call last):", f'  File "{tmp_path / "fail.py"}", line 3, in <module>'], failed.stderr
    assert failed.stderr.rstrip().endswith("ValueError: no")


def test_what_the_imports_set_in_the_environment_neither_refuses_a_request_nor_is_lost_to_its_child(tmp_path):
    """MLflow sets a variable at import: a request with the server's own starting environment is still forked,
    and its child has the variable, as a fresh process importing MLflow would."""
    import json

    (tmp_path / "sets_a_variable.py").write_text("import os\nos.environ['SET_BY_IMPORT'] = 'yes'\n")
    script = tmp_path / "child.py"
    script.write_text("import json, os\nprint(json.dumps([os.getppid(), os.environ.get('SET_BY_IMPORT')]))\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with PreloadedPython(["sets_a_variable"], tmp_path, env=env) as preloaded:
        done = preloaded.run(script, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [preloaded.server.pid, "yes"]


def test_a_server_whose_imports_load_a_module_that_must_stay_out_fails_its_requests(tmp_path):
    (tmp_path / "ok.py").write_text("pass\n")
    with PreloadedPython(["json"], tmp_path, absent=["json"]) as preloaded:
        with pytest.raises(RuntimeError, match="hung up without answering"):
            preloaded.run(tmp_path / "ok.py", timeout=60)


def test_the_shim_runs_the_next_mtrl_on_path_forked_and_passes_sigterm_on(tmp_path):
    """A stand-in ``mtrl`` next on PATH: the shim's child is it, with the shim's streams; SIGTERM reaches it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "mtrl"
    stand_in.write_text(f"#!{sys.executable}\n" + "import os, signal, sys, time\n"
                        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
                        "print('args', sys.argv[1:], 'pid', os.getpid(), flush=True)\n"
                        "if sys.argv[1:] == ['wait']:\n"
                        "    time.sleep(120)\n"
                        "sys.exit(len(sys.argv) - 1)\n")
    stand_in.chmod(0o755)
    # the shim's python3 is the venv's, as on a docs page's PATH (a pyenv shim would change
    # the environment it sends, and the server would refuse it: the shim would then run the stand-in itself)
    path = os.pathsep.join([str(SHIM.parent), str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path}
    with PreloadedPython(["json"], tmp_path, env=env, socket_env="MTRL_DOCS_PRELOADED") as preloaded:
        done = subprocess.run(["mtrl", "a", "b"], env=preloaded.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout.startswith("args ['a', 'b'] pid"), done
        assert int(done.stdout.split()[-1]) != 0
        proc = subprocess.Popen(["mtrl", "wait"], env=preloaded.env, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        child = int(line.split()[-1])
        assert child != proc.pid  # forked from the server, not the shim's own process
        proc.terminate()
        assert proc.wait(timeout=30) == 7  # the child's SIGTERM handler ran and its status came back
        # without a server to ask, the shim runs the stand-in itself
        alone = subprocess.run(["mtrl", "x"], env={k: v for k, v in env.items() if k != "MTRL_DOCS_PRELOADED"},
                               capture_output=True, text=True, timeout=60)
        assert alone.returncode == 1 and alone.stdout.startswith("args ['x'] pid"), alone
