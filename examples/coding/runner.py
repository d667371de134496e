"""Runs inside the rollout's sandbox when it is scored: the workspace's manifest, then the hidden inputs.

    python3 -B runner.py manifest             -> {"files": {path: sha256}}
    python3 -B runner.py call MODULE FUNCTION  (stdin: JSON list of argument lists)
                                              -> {"results": [{"value": v} | {"error": "Type: msg"} | {"timeout": s}]}

Standard library only. The result is the last stdout line after ``MARKER``
(the module under test may print). It returns the function's outputs, not
verdicts: the expected values never enter the sandbox, and the comparison
is made outside it (``reward.score``), so code in the workspace cannot
report a pass it did not earn. Each call has ``CALL_S`` seconds and the
import ``IMPORT_S`` (a bug that loops forever costs its inputs, not the run). ``__pycache__`` and
``.pytest_cache`` folders are left out of the manifest: running the tests
writes them.
"""

import hashlib
import importlib
import json
import os
import signal
import sys

MARKER = "@@mtrl-hidden-results@@"
CALL_S = 2.0
IMPORT_S = 10.0
IGNORED_DIRS = {"__pycache__", ".pytest_cache"}


class CallTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CallTimeout()


def plain(value):
    """The value as JSON holds it (tuples become lists), so both sides compare the same thing."""
    return json.loads(json.dumps(value, default=repr))


def manifest(root="."):
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                files[rel] = "link:" + os.readlink(path)
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(65536), b""):
                    digest.update(block)
            files[rel] = digest.hexdigest()
        for name in dirs:
            if os.path.islink(os.path.join(folder, name)):
                files[os.path.relpath(os.path.join(folder, name), root)] = "link:" + os.readlink(os.path.join(folder, name))
    return {"files": files}


def call(module_name, function_name, inputs):
    sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, IMPORT_S)
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except CallTimeout:
        return {"results": [{"error": f"importing {module_name} took more than {IMPORT_S} s"} for _ in inputs]}
    except Exception as exc:  # the module does not import: every input fails with that reason
        reason = f"{type(exc).__name__}: {exc}"
        return {"results": [{"error": reason} for _ in inputs]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    results = []
    for args in inputs:
        signal.setitimer(signal.ITIMER_REAL, CALL_S)
        try:
            results.append({"value": plain(function(*args))})
        except CallTimeout:
            results.append({"timeout": CALL_S})
        except Exception as exc:
            results.append({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return {"results": results}


def main(argv):
    if argv[1:2] == ["manifest"]:
        out = manifest()
    elif argv[1:2] == ["call"] and len(argv) == 4:
        out = call(argv[2], argv[3], json.loads(sys.stdin.read()))
    else:
        sys.stderr.write("usage: runner.py manifest | runner.py call MODULE FUNCTION < inputs.json\n")
        return 2
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
