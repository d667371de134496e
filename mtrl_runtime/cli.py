"""The ``mtrl`` command. Each subcommand is a small function registered by name."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from .registry import Registry

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: Registry[Command] = Registry("command")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML config; flags below override it")
    p.add_argument("--engine", help="engine name (hf, vllm, scripted)")
    p.add_argument("--model", help="local folder, hub id, or smollm2-135m")
    p.add_argument("--adapter", help="a peft adapter folder to serve on top of the model")
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
    overrides = {
        "core.engine": args.engine,
        "core.model": args.model,
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
    if args.adapter:
        asyncio.run(engine.load_adapter(args.adapter, 1))
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


COMMANDS.register("serve")((_serve_args, _serve))


def build_parser() -> argparse.ArgumentParser:
    from . import _cli_demo, _cli_eval, _cli_train  # noqa: F401  (each registers its commands)

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
