"""``mtrl online CONFIG``: serve the deployed agent's model and learn from its users' delayed feedback.

The config is a run's YAML (``core``, ``advanced``) with an ``online:``
section (``online.OnlineSettings``; docs/online.md). ``--rollback`` asks the
running service (at ``--url``, default the config's ``advanced.server``) to
serve the adapter promoted before the current one, and prints its answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from ._command import Command

DEFAULT_PORT = 8731


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config: core, advanced and online (docs/online.md)")
    p.add_argument("--port", type=int, help="port (default advanced.server.port, else 8731; 0: a free one)")
    p.add_argument("--run-dir", help="the run folder (overrides core.run_dir)")
    p.add_argument("--no-learn", action="store_true",
                   help="record sessions and feedback, train nothing (an engine without weights, such as scripted)")
    p.add_argument("--rollback", action="store_true",
                   help="tell the running service to serve its previous adapter again, then exit")
    p.add_argument("--url", help="with --rollback: the running service (default http://HOST:PORT of the config)")


def _run(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..online import load_online_config

    try:
        config, settings = load_online_config(args.config)
        if args.run_dir:
            config = config.with_overrides({"core.run_dir": args.run_dir})
    except ConfigError as exc:
        print(f"mtrl online: {exc}", file=sys.stderr, flush=True)
        return 2
    server = config.advanced.server
    port = args.port if args.port is not None else (server.port or DEFAULT_PORT)
    api_key = server.api_key or os.environ.get("MTRL_API_KEY")
    if args.rollback:
        return _rollback(args.url or f"http://{server.host}:{port}", api_key)
    config = config.with_overrides({"advanced.server.port": port, "advanced.server.api_key": api_key})
    return _serve(config, settings, args.no_learn)


def _serve(config: Any, settings: Any, no_learn: bool) -> int:
    from ..online import OnlineService
    from ._agents import load_strict_scorer
    from ._stopping import stop_on_sigterm

    agent = agent_env_for_spec(settings.agent) if settings.agent else None
    strict = load_strict_scorer(settings.strict, config.core.success_threshold) if settings.strict else None
    service = OnlineService.start(config, settings, agent_env=agent, strict=strict, learn=not no_learn)
    version = service.status()["serving_version"]
    serving = "the base model" if version is None else f"adapter v{version}"
    print(f"mtrl: online on {service.url}/v1 (sessions: {service.url}/online/sessions, "
          f"feedback: {service.url}/online/feedback); serving {serving}", flush=True)
    stopped = threading.Event()
    try:
        with stop_on_sigterm():
            stopped.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM made one: the way to stop; nothing is lost, close() runs below
        pass
    finally:
        service.close()
    print(f"mtrl: stopped; the sessions and trajectories are in {config.run_folder.store}", file=sys.stderr,
          flush=True)
    return 130


def agent_env_for_spec(spec: str) -> Any:
    """``online.agent``: an agent server's URL or an AgentCore Runtime ARN as given, else module:function."""
    from ..executors import is_arn, parse_runtime_arn
    from ._agents import load_agent

    if spec.startswith(("http://", "https://")):
        return spec
    if is_arn(spec):
        return str(parse_runtime_arn(spec, "online.agent"))
    return load_agent(spec, "online.agent")


def _rollback(url: str, api_key: str | None) -> int:
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(url.rstrip("/") + "/online/rollback", headers=headers, timeout=600.0)
    except httpx.HTTPError as exc:
        print(f"mtrl online --rollback: could not reach {url}: {exc}", file=sys.stderr, flush=True)
        return 1
    body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if not response.is_success:
        message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
        print(f"mtrl online --rollback: {message or response.text}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(body), flush=True)
    return 0


ONLINE = Command("online", "serve a deployed agent's model and learn online from its users' delayed feedback",
                 _args, _run)
