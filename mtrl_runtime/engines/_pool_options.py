"""The options of several vLLM servers (``servers: N``, ``urls: [...]``, ``gpus_per_server``), checked without vLLM.

The config checks them at load (``advanced.engine_options``) and the vllm
engine's factory again when it is built directly, so a bad value is an error
naming the field and the value before any server starts. Imports nothing
heavy: the config imports it.
"""

from __future__ import annotations

from typing import Any, Mapping

POOL_OPTIONS = ("servers", "urls", "gpus_per_server")
"""The engine options that ask for several servers; only the ``vllm`` engine takes them."""


def check_pool_options(options: Mapping[str, Any], where: str = "") -> int:
    """Check the pool options in ``options``; return how many servers they ask for (0: none named, one server).

    ``where`` prefixes each field in the errors (``"advanced.engine_options."`` from the config).
    """
    servers = options.get("servers")
    urls = options.get("urls")
    gpus = options.get("gpus_per_server")
    if servers is not None and (isinstance(servers, bool) or not isinstance(servers, int) or servers < 1):
        raise ValueError(f"{where}servers: expected how many vLLM servers mtrl starts, an int >= 1, got {servers!r}")
    if urls is not None:
        if isinstance(urls, (str, bytes)) or not isinstance(urls, (list, tuple)) or not urls:
            raise ValueError(f"{where}urls: expected a non-empty list of running vLLM servers' http(s) URLs, "
                             f"got {urls!r}")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(f"{where}urls: expected http(s) URLs of running vLLM servers, got {url!r}")
        normalized = [url.rstrip("/") for url in urls]
        repeated = sorted({url for url in normalized if normalized.count(url) > 1})
        if repeated:
            raise ValueError(f"{where}urls: {repeated[0]!r} is listed twice; each server once")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"{where}gpus_per_server: expected an int >= 1, got {gpus!r}")
        if servers is None:
            raise ValueError(f"{where}gpus_per_server: {gpus} needs {where}servers (the servers mtrl starts); "
                             "servers given by urls run where they were started")
    if options.get("url") is not None and (servers is not None or urls is not None):
        raise ValueError(f"{where}url: {options['url']!r} names one running server; with {where}servers or "
                         f"{where}urls list every server in {where}urls instead")
    count = (servers or 0) + len(urls or ())
    if count > 1 and "max_restarts" in options:
        raise ValueError(f"{where}max_restarts: {options['max_restarts']!r} applies to one server; with {count} "
                         "servers a server that dies leaves rotation and its rollouts move to the others; drop it")
    return count


__all__ = ["POOL_OPTIONS", "check_pool_options"]
