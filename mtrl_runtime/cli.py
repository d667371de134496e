"""The ``mtrl`` command. Each subcommand is a small function registered by name."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from .registry import Registry

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: Registry[Command] = Registry("command")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML config; flags below override it")
    p.add_argument("--engine", help="engine name (hf, vllm, scripted)")
    p.add_argument("--model", help="local folder, hub id, or smollm2-135m (default: the adapter's base model)")
    p.add_argument("--adapter", help="a peft adapter folder, or a run folder (its trained adapter), to serve")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8731)")
    p.add_argument("--run-dir", help="where the trajectory store lives")
    p.add_argument("--inference", action="store_true", help="also serve calls that name no rollout")
    p.add_argument("--api-key", help="required to bind beyond loopback (or set MTRL_API_KEY)")


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    import uvicorn

    from .config import MtrlConfig
    from .coordinator import Coordinator
    from .engines import create_engine
    from .server import KEEP_ALIVE_S, check_bind, create_app
    from .store import TrajectoryStore

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
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    server_cfg = config.advanced.server
    check_bind(server_cfg.host, server_cfg.api_key)
    engine = create_engine(config.core.engine, config.core.model, **config.advanced.engine_options)
    if adapter is not None:
        asyncio.run(engine.load_adapter(str(adapter), 1))
    config.run_dir.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(config.run_dir / "trajectories.db")
    app = create_app(Coordinator(engine, store, config))
    port = server_cfg.port or 8731
    print(f"mtrl: serving {config.core.model} ({config.core.engine}) on http://{server_cfg.host}:{port}/v1", flush=True)
    try:
        uvicorn.run(app, host=server_cfg.host, port=port, log_level="warning", access_log=False,
                    timeout_keep_alive=KEEP_ALIVE_S)
    finally:
        store.close()
    return 0


def _served_adapter(spec: str) -> tuple[Path, str | None]:
    """The LoRA folder that ``--adapter`` names (an adapter, run or checkpoint folder) and its base model, if known."""
    from .export import ExportError, find_trained_weights, resolve_base_model

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


COMMANDS.register("serve")((_serve_args, _serve))


def build_parser() -> argparse.ArgumentParser:
    from . import _cli_demo, _cli_eval, _cli_export, _cli_train  # noqa: F401  (each registers its commands)

    parser = argparse.ArgumentParser(prog="mtrl", description="Multi-turn RL for the agents you already have.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        add_args, _ = COMMANDS.get(name)
        add_args(sub.add_parser(name))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _, run = COMMANDS.get(args.command)
    return run(args)


if __name__ == "__main__":
    # Run through the package module so subcommands register where main() looks them up.
    from mtrl_runtime import cli as _cli

    sys.exit(_cli.main())
