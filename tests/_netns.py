"""Hosts that are separate on the network, made of Linux network namespaces (the multi-host tests' support).

A ``Network`` is one /24 subnet: a switch (a bridge, in a namespace of its
own) and hosts, each a namespace with one interface (``eth0``, joined to the
switch by a veth pair), its own address, its own loopback and a default
route out of ``eth0``, as a machine on a LAN has. Nothing changes in the
namespace this process runs in: every link is made inside the switch's or a
host's namespace, so parallel runs (each with its own names) cannot collide.
Processes run on a host through ``ip netns exec``; ``kill_host`` ends every
process in a host's namespace (what unplugging a machine does to its work);
``close`` ends them all and deletes the namespaces, and runs in the fixture's
teardown whatever the test did.

``namespaces_problem`` says why namespaces cannot be made here (not root,
no CAP_NET_ADMIN, no ``ip``, no veth or bridge support) by trying to make
one with a veth pair, rather than guessing from the user id.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

ETC_NETNS = Path("/etc/netns")  # where `ip netns exec` finds a namespace's own /etc files


@dataclass(frozen=True)
class Host:
    """One namespace on the network: its name, its address on the subnet."""

    name: str
    netns: str
    address: str


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def namespaces_problem() -> str | None:
    """Why network namespaces joined by a veth pair and a bridge cannot be made here; None when they can."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"mtrlprobe{uuid.uuid4().hex[:8]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace (needs root or CAP_NET_ADMIN): {made.stderr.strip()}"
    try:
        for args in (("link", "add", "br0", "type", "bridge"),
                     ("link", "add", "a0", "type", "veth", "peer", "name", "b0"),
                     ("link", "set", "a0", "master", "br0")):
            out = _ip("-n", probe, *args, check=False)
            if out.returncode != 0:
                return f"cannot make a veth pair on a bridge in a network namespace: ip {' '.join(args)}: " \
                       f"{out.stderr.strip()}"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


@dataclass
class Network:
    """A switch and the hosts on it (see the module docstring); ``close()`` removes everything it made."""

    subnet: str = "10.77.0"  # the hosts get .1, .2, ...; private to these namespaces, so any subnet will do
    prefix: str = field(default_factory=lambda: f"mtrl{uuid.uuid4().hex[:6]}")
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.switch = f"{self.prefix}-switch"
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        try:
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except Exception:
            self.close()  # the caller gets no network to close
            raise

    def add_host(self, name: str) -> Host:
        """A new namespace on the switch, with the next address of the subnet."""
        if name in self.hosts:
            raise ValueError(f"name: host {name!r} already exists")
        host = Host(name, f"{self.prefix}-{name}", f"{self.subnet}.{len(self.hosts) + 1}")
        _ip("netns", "add", host.netns)
        self._made.append(host.netns)
        port = f"p{len(self.hosts) + 1}"  # the switch's end of the pair, named inside the switch's namespace
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        # a default route, as a machine has: programs that find "their" address by routing toward the internet
        # (Ray's get_node_ip_address) pick eth0's; nothing is reachable beyond the switch
        _ip("-n", host.netns, "route", "add", "default", "dev", "eth0")
        self.hosts[name] = host
        self._write_resolver_files()
        return host

    def _write_resolver_files(self) -> None:
        """Each host's /etc/hosts and /etc/resolv.conf, as ``ip netns exec`` mounts them (``/etc/netns/<name>/``).

        The hosts know each other by name; a DNS query goes to the host's own loopback, where nothing
        answers, so it fails at once instead of waiting out a timeout toward a name server that is not on
        this network (Python's ``getfqdn``, which ``http.server`` and others call, would wait 5 s).
        """
        names = "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        for host in self.hosts.values():
            folder = ETC_NETNS / host.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
            (folder / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def popen(self, host: Host, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (its own session), output to ``log``."""
        process = subprocess.Popen(["ip", "netns", "exec", host.netns, *argv], env=dict(env or os.environ),
                                   stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)
        process.log_path = log  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def run(self, host: Host, argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to its end; its output captured."""
        return subprocess.run(["ip", "netns", "exec", host.netns, *argv], env=dict(env or os.environ),
                              capture_output=True, text=True, timeout=timeout)

    def pids(self, host: Host) -> list[int]:
        """Every process whose network namespace is the host's (what it started, and what those started)."""
        out = _ip("netns", "pids", host.netns, check=False)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, host: Host, timeout: float = 10) -> list[int]:
        """SIGKILL every process on ``host`` (the machine is lost with its work); returns the pids killed."""
        killed: list[int] = []
        deadline = time.monotonic() + timeout
        while pids := self.pids(host):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:  # it ended between the listing and the kill
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes on {host.name} outlived SIGKILL for {timeout} s: {pids}")
            time.sleep(0.05)
        for process in self.processes:  # reap the ones this process started, so none stays a zombie
            if process.poll() is None and process.args[3] == host.netns:
                try:
                    process.wait(timeout=1)
                except subprocess.TimeoutExpired:  # not on this host after all (a wrapper): close() reaps it
                    pass
        return sorted(set(killed))

    def stop_host(self, host: Host, grace: float = 5) -> None:
        """SIGTERM the processes this network started on ``host``, then SIGKILL whatever is left there."""
        for process in self.processes:
            if process.args[3] == host.netns and process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:  # already gone
                    pass
        deadline = time.monotonic() + grace
        while self.pids(host) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill_host(host)

    def close(self) -> None:
        """End every process on every host, then delete the namespaces (safe to call twice)."""
        errors: list[str] = []
        for host in list(self.hosts.values()):  # throwaway hosts: no graceful stop to wait for
            try:
                self.kill_host(host)
            except Exception as exc:  # noqa: BLE001 - go on removing the rest; said at the end
                errors.append(f"{host.name}: {exc}")
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        while self._made:
            netns = self._made.pop()
            shutil.rmtree(ETC_NETNS / netns, ignore_errors=True)
            out = _ip("netns", "del", netns, check=False)
            if out.returncode != 0:
                errors.append(out.stderr.strip())
        self.hosts.clear()
        if errors:
            raise RuntimeError("cleaning up the network: " + "; ".join(errors))
