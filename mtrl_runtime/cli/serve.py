"""``mtrl serve``: serve a model (and optionally a trained adapter) over an OpenAI-compatible endpoint.

``_serve`` turns the flags and the config into one ``MtrlConfig``;
``_run_server`` builds the same rollout stack training uses (engine, store,
coordinator; ``rollouts.RolloutStack``) and serves its app until interrupted.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._command import Command

if TYPE_CHECKING:
    from ..config import MtrlConfig


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML config; flags below override it")
    p.add_argument("--engine", help="engine name (hf, vllm, scripted)")
    p.add_argument("--script", help="with --engine scripted: a JSON/YAML script of per-task replies and tool calls")
    p.add_argument("--model", help="local folder, hub id, or smollm2-135m (default: the adapter's base model)")
    p.add_argument("--adapter", help="a peft adapter folder, or a run folder (its trained adapter), to serve")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8731; 0: a free one, printed on the serving line)")
    p.add_argument("--run-dir", help="where the trajectory store lives")
    p.add_argument("--inference", action="store_true", help="also serve calls that name no rollout")
    p.add_argument("--api-key", help="required to bind beyond loopback (or set MTRL_API_KEY)")


def _serve(args: argparse.Namespace) -> int:
    from ..config import MtrlConfig
    from ..server import check_bind

    config = MtrlConfig.from_yaml(args.config) if args.config else MtrlConfig()
    adapter, adapter_base = _served_adapter(args.adapter) if args.adapter else (None, None)
    overrides = {
        "core.engine": args.engine,
        "core.model": args.model or (None if args.config else adapter_base),
        "core.run_dir": args.run_dir,
        "advanced.server.host": args.host,
        "advanced.server.port": args.port,
        "advanced.server.api_key": args.api_key or os.environ.get("MTRL_API_KEY"),
        "advanced.server.inference_mode": True if args.inference else None,
    }
    if args.script is not None:
        overrides["advanced.engine_options.script_file"] = str(Path(args.script).resolve())
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    if args.script is not None and config.core.engine != "scripted":
        raise SystemExit(f"mtrl serve: --script {args.script!r}: only the scripted engine takes a script "
                         f"(the engine is {config.core.engine!r}; add --engine scripted)")
    check_bind(config.advanced.server.host, config.advanced.server.api_key)
    if config.advanced.server.rollout_ttl_s is None:  # serve mode: a rollout nobody uses is abandoned after an hour
        config = config.with_overrides({"advanced.server.rollout_ttl_s": SERVE_ROLLOUT_TTL_S})
    # the config's port 0 means "unset" here (mtrl serve's default); --port 0 asks for a free port
    port = 0 if args.port == 0 else (config.advanced.server.port or DEFAULT_PORT)
    return _run_server(config, adapter, port)


DEFAULT_PORT = 8731
SERVE_ROLLOUT_TTL_S = 3600.0  # mtrl serve's advanced.server.rollout_ttl_s unless the config sets one


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (0: a free port), so that the serving line names the port it got."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"mtrl serve: cannot listen on {host}:{port}: {exc}; choose another --port "
                         "(--port 0 takes a free one)") from None
    sock.listen(2048)
    return sock


def _signalled_server_class() -> type:
    """uvicorn's Server, remembering whether a signal (Ctrl-C, SIGTERM) told it to stop."""
    import uvicorn

    class SignalledServer(uvicorn.Server):
        signalled = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.signalled = True
            super().handle_exit(sig, frame)

    return SignalledServer


def _run_server(config: MtrlConfig, adapter: Path | None, port: int) -> int:
    """Build the rollout stack (engine with ``adapter`` loaded, store, coordinator) and serve it until stopped.

    Served with the setup every entry point shares (``server.server_config``: the header deadline, keep-alive,
    lifespan). Ctrl-C or SIGTERM stops it: requests in flight get two seconds, the stack is closed, one line says
    so, and the status is 130 (no traceback).
    """
    import asyncio

    from ..rollouts import RolloutStack
    from ..server import create_app, server_config
    from ._stopping import stop_on_sigterm

    _SignalledServer = _signalled_server_class()
    server_cfg = config.advanced.server
    sock = _listen(server_cfg.host, port)  # before the model loads: a port in use fails at once
    stack, stopped = None, False
    try:
        stack = RolloutStack.build(config, store_path=config.run_folder.store, serve=False)
        if adapter is not None:
            asyncio.run(stack.engine.load_adapter(str(adapter), 1))
        app = create_app(stack.coordinator)
        bound = sock.getsockname()[1]
        server = _SignalledServer(server_config(app, server_cfg.host, bound))
        print(f"mtrl: serving {stack.coordinator.served_model} ({config.core.engine}) on "
              f"http://{server_cfg.host}:{bound}/v1", flush=True)
        with stop_on_sigterm():
            server.run(sockets=[sock])  # uvicorn stops on the signal, then raises it again: KeyboardInterrupt
        # uvicorn re-raises the signal it stopped on, but once (a full suite run) Ctrl-C ended here without the
        # KeyboardInterrupt and the status was 0: the server's own record of the signal decides
        stopped = server.signalled
    except KeyboardInterrupt:
        stopped = True
    finally:
        sock.close()
        if stack is not None:
            asyncio.run(stack.close())
    if stopped:
        print(f"mtrl: stopped; the trajectories are in {config.run_folder.store}", file=sys.stderr,
              flush=True)
        return 130
    return 0


def _served_adapter(spec: str) -> tuple[Path, str | None]:
    """The LoRA folder that ``--adapter`` names (an adapter, run or checkpoint folder) and its base model, if known."""
    from ..export import ExportError, find_trained_weights, resolve_base_model

    try:
        weights = find_trained_weights(spec, field="--adapter")
        if weights.kind != "lora":
            raise ExportError(f"--adapter {spec!r}: holds full model weights, not a LoRA adapter; "
                              "serve it with --model")
        try:
            base: str | None = str(resolve_base_model(weights))
        except ExportError:
            base = None  # the adapter's base is not here: --model or the config must name it
    except ExportError as exc:
        raise SystemExit(f"mtrl serve: {exc}") from None
    return weights.folder, base


SERVE = Command("serve", "serve a model (and a trained adapter) over an OpenAI-compatible endpoint",
                _serve_args, _serve)
