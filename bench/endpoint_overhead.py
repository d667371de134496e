"""What the policy endpoint adds per chat completion, against the same engine called in process.

Side by side in one run, on the scripted engine (so the model costs nothing):

1. in process: ``await engine.generate(...)`` on the prompt the endpoint would build;
2. through the endpoint: an HTTP chat completion attributed to a rollout, which
   renders the chat template, tokenizes, generates, parses tool calls and commits
   the turn to SQLite before answering (``mtrl serve`` in its own process).

The client is a minimal keep-alive HTTP/1.1 client (one connection per
concurrent client, about 0.05 ms of CPU a call), so the machine's two cores
go to the server rather than to the client. Reported: p50/p99 latency at 1
and 32 concurrent clients (and streamed, at 1), the endpoint's own CPU time
per completion (from /proc of the server process, robust to other load),
the client's, the completions per second one endpoint process sustains, and
its memory per stored call.

    .venv/bin/python bench/endpoint_overhead.py [--requests 2000]

To measure another version of the server with the same client, unpack it
and point ``--tree`` at it (the client and the baseline stay this one's)::

    git archive <commit> mtrl_runtime mtrl_adapters | tar -x -C /tmp/old
    .venv/bin/python bench/endpoint_overhead.py --tree /tmp/old --out /tmp/old.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable
from pathlib import Path

from mtrl_runtime.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "endpoint_overhead.json"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Look up the {name} record.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
    for name in ("lookup", "inspect")
]
MESSAGES = [
    {"role": "system", "content": "You are an inspection agent. Follow the procedure."},
    {"role": "user", "content": "Inspect aircraft N123AB and report."},
]
SETTINGS = {"clients_1": (1, False), "clients_32": (32, False), "clients_1_stream": (1, True)}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the whole answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, port: int) -> "Connection":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, f"127.0.0.1:{port}")

    async def post(self, path: str, body: bytes, token: str | None = None) -> tuple[int, bytes]:
        auth = f"authorization: Bearer {token}\r\n" if token else ""
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n{auth}\r\n")
        self.writer.write(head.encode() + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:] if line)
        if b"content-length" in headers:
            return int(lines[0].split()[1]), await self.reader.readexactly(int(headers[b"content-length"]))
        chunks = []  # chunked transfer encoding
        while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
            chunks.append((await self.reader.readexactly(size + 2))[:-2])
        await self.reader.readuntil(b"\r\n")
        return int(lines[0].split()[1]), b"".join(chunks)

    def close(self) -> None:
        self.writer.close()


async def in_process(n: int, concurrency: int) -> dict[str, float]:
    from mtrl_runtime.chat import ChatRenderer, normalize_messages
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.testing import tiny_tokenizer
    from mtrl_runtime.types import GenerationRequest, SamplingParams

    tok = tiny_tokenizer()
    engine = ScriptedEngine(tok, lambda request, prompt: "DONE")
    ids = tuple(ChatRenderer(tok).encode(ChatRenderer(tok).render(normalize_messages(MESSAGES), TOOLS, True)))
    request = GenerationRequest(prompt_ids=ids, sampling=SamplingParams(max_tokens=64), rollout_id="r", turn_index=0)
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            await engine.generate(request)
            latencies.append(time.perf_counter() - t0)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "cpu_ms_per_call": cpu / n * 1e3,
        "calls_per_s": n / wall,
    }


async def create_rollouts(port: int, n: int) -> list[dict]:
    conn = await Connection.open(port)
    created = []
    for i in range(n):
        _, body = await conn.post("/v1/rollouts", json.dumps({"task_id": f"t{i % 50}", "prompt": "inspect"}).encode())
        created.append(json.loads(body))
    conn.close()
    return created


async def complete_rollouts(port: int, created: list[dict]) -> None:
    conn = await Connection.open(port)
    for rollout in created:
        await conn.post(f"/rollouts/{rollout['rollout_id']}/complete", b'{"status":"completed"}', rollout["token"])
    conn.close()


async def first_turns(
    port: int, pid: int, n: int, concurrency: int, path: str, body: bytes, ok: Callable[[int, bytes], bool]
) -> dict[str, Any]:
    """``n`` first turns of ``n`` fresh rollouts (POST ``/rollouts/{id}{path}``), from ``concurrency`` clients each
    on its own connection; the latencies, wall time, the server's and this client's CPU seconds, and the answers
    ``ok`` refused. Creating and completing the rollouts is untimed (memory is read with nothing live)."""
    created = await create_rollouts(port, n)
    conns = [await Connection.open(port) for _ in range(concurrency)]
    latencies: list[float] = []
    errors = 0
    queue = list(created)

    async def worker(conn: Connection) -> None:
        nonlocal errors
        while queue:
            rollout = queue.pop()
            t0 = time.perf_counter()
            status, answer = await conn.post(f"/rollouts/{rollout['rollout_id']}{path}", body, rollout["token"])
            latencies.append(time.perf_counter() - t0)
            errors += not ok(status, answer)

    cpu0, client0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(conn) for conn in conns))
    wall, cpu, client = time.perf_counter() - t0, cpu_seconds(pid) - cpu0, time.process_time() - client0
    for conn in conns:
        conn.close()
    await complete_rollouts(port, created)
    return {"latencies": latencies, "wall_s": wall, "cpu_s": cpu, "client_cpu_s": client, "errors": errors}


async def through_endpoint(port: int, pid: int, n: int, concurrency: int, stream: bool) -> dict[str, float]:
    """``n`` first turns of ``n`` fresh rollouts, from ``concurrency`` clients each on its own connection."""
    body = json.dumps({"model": "policy", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 64, "stream": stream,
                       **({"stream_options": {"include_usage": True}} if stream else {})}).encode()
    end = b"[DONE]" if stream else b"}"
    run = await first_turns(port, pid, n, concurrency, "/v1/chat/completions", body,
                            lambda status, answer: status == 200 and answer.rstrip().endswith(end))
    latencies = run["latencies"]
    return {
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "server_cpu_ms_per_call": run["cpu_s"] / n * 1e3,
        "client_cpu_ms_per_call": run["client_cpu_s"] / n * 1e3,
        "calls_per_s": n / run["wall_s"],
        "errors": run["errors"],
    }


def start_server(tmp: Path, tree: Path = ROOT) -> tuple[subprocess.Popen, int]:
    """``mtrl serve`` on the scripted engine, from the source tree ``tree``."""
    from mtrl_runtime.testing import save_tiny_model

    model_dir = save_tiny_model(tmp / "tiny")
    config = tmp / "bench.yaml"
    config.write_text("core:\n  max_turns: 1000\n")
    port = free_port()
    cmd = [
        sys.executable, "-m", "mtrl_runtime.cli", "serve", "--config", str(config), "--engine", "scripted",
        "--model", str(model_dir), "--run-dir", str(tmp / "run"), "--port", str(port),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, port
        except OSError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode())
    raise TimeoutError("mtrl serve did not start")


async def main(n: int, tree: Path) -> dict:
    results: dict = {
        "requests_per_setting": n,
        "server_tree": str(tree),
        "machine": f"{os.cpu_count()} cores",
        "dtype": "none (scripted engine: no model runs)",
        "client": "raw asyncio HTTP/1.1, keep-alive, one connection per client",
        "loadavg_start": os.getloadavg(),
        "settings": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(Path(tmp), tree)
        try:
            await through_endpoint(port, proc.pid, 300, 8, False)  # warm-up
            await through_endpoint(port, proc.pid, 100, 1, True)
            rss_before = rss_bytes(proc.pid)
            rss_after_each = []
            for name, (conc, stream) in SETTINGS.items():
                base = await in_process(n, conc)
                http = await through_endpoint(port, proc.pid, n, conc, stream)
                results["settings"][name] = {
                    "in_process": base,
                    "endpoint": http,
                    "added_p50_ms": http["p50_ms"] - base["p50_ms"],
                    "added_p99_ms": http["p99_ms"] - base["p99_ms"],
                }
                rss_after_each.append(rss_bytes(proc.pid) / 2**20)
            rss_after = rss_bytes(proc.pid)
            calls = len(SETTINGS) * n
            results["memory"] = {
                "rss_before_mb": rss_before / 2**20,
                "rss_after_mb": rss_after / 2**20,
                "bytes_per_stored_call": (rss_after - rss_before) / calls,
                "calls": calls,
                "rss_mb_after_each_setting": rss_after_each,
            }
        finally:
            proc.terminate()
            proc.wait(10)
    results["loadavg_end"] = os.getloadavg()
    return results


def report(results: dict) -> None:
    print(f"endpoint overhead, scripted engine, {results['requests_per_setting']} completions per setting "
          f"(load average {results['loadavg_start'][0]:.1f} at start, {results['loadavg_end'][0]:.1f} at end)")
    print(f"{'clients':>9} {'in-proc p50':>12} {'endpoint p50':>13} {'added p50':>10} {'added p99':>10} "
          f"{'server CPU/call':>16} {'client CPU/call':>16} {'completions/s':>14}")
    for name, s in results["settings"].items():
        e = s["endpoint"]
        label = name.removeprefix("clients_").replace("_stream", " SSE")
        print(
            f"{label:>9} {s['in_process']['p50_ms']:>10.3f}ms {e['p50_ms']:>11.3f}ms "
            f"{s['added_p50_ms']:>8.3f}ms {s['added_p99_ms']:>8.3f}ms "
            f"{e['server_cpu_ms_per_call']:>14.3f}ms {e['client_cpu_ms_per_call']:>14.3f}ms {e['calls_per_s']:>14.0f}"
            + (f"  ({e['errors']} errors)" if e["errors"] else "")
        )
    one, many = results["settings"]["clients_1"], results["settings"]["clients_32"]
    print(f"goal: added p50 with 1 client <= 1.5 ms: {one['added_p50_ms']:.3f} ms "
          f"(ratio to goal {one['added_p50_ms'] / 1.5:.2f})")
    print(f"goal: >= 500 completions/s: {many['endpoint']['calls_per_s']:.0f}/s "
          f"(ratio to goal {many['endpoint']['calls_per_s'] / 500:.2f})")
    m = results["memory"]
    print(f"memory: {m['rss_before_mb']:.1f} MB -> {m['rss_after_mb']:.1f} MB over {m['calls']} stored calls "
          f"({m['bytes_per_stored_call']:.0f} bytes per call; after each setting: "
          + ", ".join(f"{mb:.1f}" for mb in m["rss_mb_after_each_setting"]) + " MB)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the source tree whose server is measured")
    args = parser.parse_args()
    out = asyncio.run(main(args.requests, args.tree.resolve()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    report(out)
