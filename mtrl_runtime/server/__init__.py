"""The coordinator's HTTP server: OpenAI-compatible policy endpoint and rollout routes."""

from ._app import KEEP_ALIVE_S, ServerHandle, check_bind, create_app, is_loopback, server_config, start_server

__all__ = ["KEEP_ALIVE_S", "ServerHandle", "check_bind", "create_app", "is_loopback", "server_config", "start_server"]
