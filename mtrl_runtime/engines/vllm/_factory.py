"""The ``vllm`` engine's registry factory: one server (``VLLMEngine``), or several behind an ``EnginePool``.

``create(model, **options)``:

- no ``servers`` / ``urls``: one ``VLLMEngine`` (started by mtrl, or ``url=``
  of one already running), as before;
- ``servers: N``: N servers started by mtrl on this machine, each on its own
  port; with GPUs visible each gets ``gpus_per_server`` of them (default: the
  visible GPUs split evenly) through ``CUDA_VISIBLE_DEVICES``, and
  ``--tensor-parallel-size`` when it is more than one;
- ``urls: [...]``: servers already running (started with ``--enable-lora``
  and ``--logprobs-mode raw_logprobs``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``);
- both: the started servers and the listed ones in one pool.

Every server shares one tokenizer (loaded once). In a pool a server is not
restarted when it dies: it leaves rotation and its rollouts move (``_pool``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx

from .._loading import resolve_model
from .._tokenizer import load_tokenizer
from .._pool_options import check_pool_options
from ._engine import VLLMEngine
from ._pool import EnginePool, PoolMember, Probe, make_pool

_SHARED = ("keep_versions", "startup_timeout_s", "request_timeout_s", "extra_body")  # options every server takes
_PROBE_TIMEOUT_S = 5.0


def create(
    model: str | None,
    *,
    servers: int | None = None,
    urls: Sequence[str] | None = None,
    gpus_per_server: int | None = None,
    **options: Any,
) -> VLLMEngine | EnginePool:
    """The ``vllm`` factory (see the module docstring); ``options`` are ``VLLMEngine``'s."""
    pool_options = {"servers": servers, "urls": urls, "gpus_per_server": gpus_per_server, **options}
    count = check_pool_options(pool_options)
    if count <= 1:
        if urls:
            return VLLMEngine(model, url=urls[0], **options)
        if gpus_per_server is not None:  # one server started here, on gpus_per_server of the visible GPUs
            options.update(_per_server(0, _devices(1, gpus_per_server, options)[0], options, several=False))
        return VLLMEngine(model, **options)
    return create_pool(model, servers=servers or 0, urls=list(urls or ()), gpus_per_server=gpus_per_server, **options)


def create_pool(
    model: str | None,
    *,
    servers: int = 0,
    urls: Sequence[str] = (),
    gpus_per_server: int | None = None,
    **options: Any,
) -> EnginePool:
    """``servers`` started here and the running ``urls``, one ``VLLMEngine`` each, in one pool."""
    shared = {k: options.pop(k) for k in _SHARED if k in options}
    tokenizer = options.pop("tokenizer", None)
    if model is None and (servers or tokenizer is None):
        raise ValueError("model: several vLLM servers need the served model's folder (to serve, and for its "
                         "tokenizer; with urls only, tokenizer= will do)")
    if options and not servers:
        raise ValueError(f"urls: the servers are already running; drop {sorted(options)} (they configure servers "
                         "mtrl starts)")
    folder = resolve_model(str(model)) if model is not None else None
    if tokenizer is None:
        tokenizer = load_tokenizer(folder)
    members: list[PoolMember] = []
    if servers:
        members += _started_servers(folder, servers, gpus_per_server, tokenizer, shared, options)
    for i, url in enumerate(urls):
        engine = VLLMEngine(folder, url=url, tokenizer=tokenizer, **shared)
        members.append(PoolMember(f"url-{i}", engine, _probe(engine), engine.url))
    return make_pool(members)


def _started_servers(
    folder: Path | None, count: int, gpus_per_server: int | None, tokenizer: Any, shared: Mapping[str, Any],
    options: dict[str, Any],
) -> list[PoolMember]:
    devices = _devices(count, gpus_per_server, options)
    base = {k: v for k, v in options.items() if k not in ("env", "port", "log_path", "server_args")}
    members = []
    for i, gpus in enumerate(devices):
        # a pool does not restart a dead server (max_restarts=0): it leaves rotation and its rollouts move
        engine = VLLMEngine(folder, tokenizer=tokenizer, max_restarts=0, **shared, **base,
                            **_per_server(i, gpus, options))
        where = engine.url + (f", CUDA_VISIBLE_DEVICES={','.join(gpus)}" if gpus is not None else "")
        members.append(PoolMember(f"server-{i}", engine, _probe(engine), where))
    return members


def _devices(count: int, gpus_per_server: int | None, options: Mapping[str, Any]) -> list[list[str] | None]:
    env = options.get("env") or {}
    return assign_gpus(count, visible_gpus(env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))),
                       gpus_per_server)


def _per_server(i: int, gpus: list[str] | None, options: Mapping[str, Any], several: bool = True) -> dict[str, Any]:
    """Server ``i``'s own env (its GPUs), server args (tensor parallel over them), port and log file."""
    env = dict(options.get("env") or {})
    args = list(options.get("server_args") or ())
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        if len(gpus) > 1 and "--tensor-parallel-size" not in args and "-tp" not in args:
            args += ["--tensor-parallel-size", str(len(gpus))]
    out: dict[str, Any] = {"env": env, "server_args": args}
    if options.get("port") is not None:
        out["port"] = int(options["port"]) + i
    if options.get("log_path") is not None:
        path = Path(options["log_path"])
        out["log_path"] = path.with_name(f"{path.stem}-{i}{path.suffix}") if several else path
    return out


def visible_gpus(cuda_visible_devices: str | None) -> list[str]:
    """The GPUs servers may use: ``CUDA_VISIBLE_DEVICES`` when set, else those ``nvidia-smi -L`` lists, else none."""
    if cuda_visible_devices is not None:
        return [d.strip() for d in cuda_visible_devices.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(ln for ln in listed.splitlines() if ln.startswith("GPU "))]


def assign_gpus(servers: int, visible: Sequence[str], per_server: int | None) -> list[list[str] | None]:
    """Each server's GPUs (None for every server when there are none: vLLM on CPU)."""
    if not visible:
        if per_server is not None:
            raise ValueError(f"gpus_per_server: {per_server} but no GPU is visible (CUDA_VISIBLE_DEVICES and "
                             "nvidia-smi list none); leave it out to run the servers on CPU")
        return [None] * servers
    each = per_server if per_server is not None else len(visible) // servers
    if each < 1 or each * servers > len(visible):
        raise ValueError(f"servers: {servers} servers x gpus_per_server {per_server if per_server else each or 1} "
                         f"need more than the {len(visible)} visible GPU(s) ({','.join(visible)}); lower servers or "
                         "gpus_per_server")
    return [list(visible[i * each:(i + 1) * each]) for i in range(servers)]


def _probe(engine: VLLMEngine) -> Probe:
    """True while the server serves: an owned server's process is alive; a server by URL answers ``/health``."""

    async def probe() -> bool:
        server = engine.server
        if server is not None:
            return server.alive()
        try:
            async with httpx.AsyncClient(timeout=_PROBE_TIMEOUT_S) as http:
                return (await http.get(engine.url + "/health")).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


__all__ = ["assign_gpus", "create", "create_pool", "visible_gpus"]
