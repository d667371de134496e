"""The AgentCore stand-in as a service on its own host, for the multi-host test.

    python tests/_host_agentcore.py HOST PORT ARN LOG.jsonl

serves ``mtrl_integrations.agentcore_standin`` on ``HOST:PORT`` with one
runtime, ``ARN``, running ``_agentcore_apps.answer_app`` (its container on
this host's loopback), prints ``ready`` and serves until SIGTERM; then it
writes every call it answered to ``LOG.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path


def main(host: str, port: int, arn: str, log: Path) -> None:
    import _agentcore_apps as apps
    from mtrl_integrations.agentcore_standin import AgentCoreStandIn

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with AgentCoreStandIn({arn: apps.answer_app()}, host=host, port=port) as service:
        print("ready", service.endpoint_url, flush=True)
        stop.wait()
        calls = [dataclasses.asdict(i) for i in service.invocations]
    log.write_text("".join(json.dumps(c) + "\n" for c in calls))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
