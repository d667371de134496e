"""What a harness CLI needs to run one rollout: its npm package, and how it is pointed at the rollout.

A ``Harness`` is declared data plus one function, ``launch``: given the
prompt, the base URL its SDK family takes (``mtrl_adapters.wire.BASE_URL_SUFFIXES``),
the rollout's token, the model name and the sandbox's ``$HOME``, it returns
the command line, the environment and the config files that point the
unchanged CLI at the rollout. Only what the harness documents for this is
used: its base-URL and key variables or config file, headless mode, and the
switches an offline user sets (telemetry, update checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping


@dataclass(frozen=True)
class HarnessCall:
    """One run of a harness: the task's prompt and where the rollout's model calls go."""

    prompt: str
    base_url: str  # as the harness's SDK family takes it (``Harness.family``)
    token: str
    model: str
    home: str  # the sandbox's $HOME, where config files go


@dataclass(frozen=True)
class Launch:
    """The command line, the environment (over the sandbox's own) and the files (absolute paths) to write first."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Harness:
    """A harness CLI from the npm registry, pinned, and how one rollout launches it."""

    name: str
    package: str  # npm package
    version: str  # pinned: harnesses change their wire between releases
    binary: str  # its command in node_modules/.bin
    family: str  # the SDK family whose base URL it takes: openai, anthropic, gemini
    protocol: str  # what it speaks on the wire (docs, and the tests' checks)
    launch: Callable[[HarnessCall], Launch]


__all__ = ["Harness", "HarnessCall", "Launch"]
