"""The served wire protocols, as a registry: one route module per protocol, OpenAI chat completions included.

Each module routes its protocol's calls through the shared
``ProtocolEndpoint`` (``_endpoint``) into the coordinator's one capture path
(``Coordinator.chat``: OpenAI-shaped messages and tools, the rollout's token
checked by ``server._attribution.attribute_call``), using its protocol's
translations in ``wires.<name>`` both ways, streamed and not. A module
exposes ``build_router(coordinator) -> fastapi.APIRouter`` and ``PATHS``,
the paths it serves (documented in ``docs/protocols.md``).

``PROTOCOLS`` maps each protocol's name (its ``wires.WIRES`` name) to its
module (relative to this package), imported when the app is built; every
registered protocol is served, in this order (chat completions, the hot
route, first).
"""

from __future__ import annotations

import importlib
from typing import Any

PROTOCOLS: dict[str, str] = {
    "openai_chat": ".openai_chat",
    "openai_responses": ".openai_responses",
    "anthropic_messages": ".anthropic_messages",
    "bedrock_converse": ".bedrock_converse",
    "gemini": ".gemini",
}


def protocol_module(name: str) -> Any:
    """The module serving protocol ``name``; an unknown name is an error listing the known ones."""
    try:
        path = PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(sorted(PROTOCOLS)) or 'none'}") from None
    return importlib.import_module(path, __name__)


def build_routers(coordinator: Any, names: list[str] | None = None) -> list[Any]:
    """The routers of the named protocols (all registered ones when ``names`` is None), in registry order."""
    chosen = list(PROTOCOLS) if names is None else names
    return [protocol_module(name).build_router(coordinator) for name in chosen]


__all__ = ["PROTOCOLS", "build_routers", "protocol_module"]
