"""The harnesses mtrl runs unchanged: Claude Code, Codex CLI, opencode, gemini-cli (``HARNESSES``).

Each ``launch`` uses only the harness's documented settings: its base URL
and key (environment variables or its config file), headless mode with tool
permissions granted (the sandbox is the boundary), and telemetry, update
checks and other non-essential traffic off (the sandbox reaches nothing but
the coordinator).
"""

from __future__ import annotations

import json

from ..registry import Registry
from ._spec import Harness, HarnessCall, Launch

# the model name a harness's background calls (titles, summaries) name, so the coordinator answers them as
# non-policy calls (``advanced.server.background_models`` holds it by default)
BACKGROUND_MODEL = "mtrl-background"

HARNESSES: Registry[Harness] = Registry("harness")


def _claude_code(call: HarnessCall) -> Launch:
    env = {
        "ANTHROPIC_BASE_URL": call.base_url,  # the SDK appends /v1/messages
        "ANTHROPIC_API_KEY": call.token,
        "ANTHROPIC_MODEL": call.model,
        "ANTHROPIC_SMALL_FAST_MODEL": BACKGROUND_MODEL,  # its background model (titles, topic checks) ...
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": BACKGROUND_MODEL,  # ... under its newer name
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "IS_SANDBOX": "1",  # its documented switch for containers: permissions may be skipped there
    }
    return Launch(("claude", "-p", call.prompt, "--dangerously-skip-permissions", "--output-format", "json"), env)


def _codex(call: HarnessCall) -> Launch:
    config = (
        f'model = {json.dumps(call.model)}\n'
        'model_provider = "mtrl"\n'
        '[model_providers.mtrl]\n'
        'name = "mtrl"\n'
        f'base_url = {json.dumps(call.base_url)}\n'  # ends in /v1: Codex appends /responses
        'env_key = "MTRL_TOKEN"\n'
        'wire_api = "responses"\n'
        'request_max_retries = 0\n'
        'stream_max_retries = 0\n'
        '[analytics]\nenabled = false\n'
    )
    home = f"{call.home}/.codex"
    return Launch(
        ("codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", call.prompt),
        {"CODEX_HOME": home, "MTRL_TOKEN": call.token},
        {f"{home}/config.toml": config},
    )


def _opencode(call: HarnessCall) -> Launch:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"mtrl": {"npm": "@ai-sdk/openai-compatible", "name": "mtrl",
                              "options": {"baseURL": call.base_url, "apiKey": call.token},
                              "models": {call.model: {"name": call.model},
                                         BACKGROUND_MODEL: {"name": BACKGROUND_MODEL}}}},
        "model": f"mtrl/{call.model}",
        "small_model": f"mtrl/{BACKGROUND_MODEL}",  # its title generation
        "autoupdate": False,
        "share": "disabled",
    }
    return Launch(("opencode", "run", call.prompt),
                  {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1"},
                  {f"{call.home}/.config/opencode/opencode.json": json.dumps(config, indent=1)})


def _gemini_cli(call: HarnessCall) -> Launch:
    settings = {"privacy": {"usageStatisticsEnabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                # the key in GEMINI_API_KEY (no Google login), and the sandbox's folder trusted so --yolo holds
                "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}}}
    return Launch(
        ("gemini", "-p", call.prompt, "--yolo", "--model", call.model),
        {"GOOGLE_GEMINI_BASE_URL": call.base_url, "GEMINI_API_KEY": call.token},
        {f"{call.home}/.gemini/settings.json": json.dumps(settings, indent=1)},
    )


for _harness in (
    Harness("claude_code", "@anthropic-ai/claude-code", "2.1.332", "claude", "anthropic", "anthropic_messages",
            _claude_code),
    Harness("codex", "@openai/codex", "0.171.0", "codex", "openai", "openai_responses", _codex),
    Harness("opencode", "opencode-ai", "1.18.33", "opencode", "openai", "openai_chat", _opencode),
    Harness("gemini_cli", "@google/gemini-cli", "0.61.0", "gemini", "gemini", "gemini", _gemini_cli),
):
    HARNESSES.register(_harness.name)(_harness)

__all__ = ["BACKGROUND_MODEL", "HARNESSES"]
