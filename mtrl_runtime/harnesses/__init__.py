"""Harness CLIs (Claude Code, Codex CLI, opencode, gemini-cli) run unchanged as rollouts, each in its sandbox.

``run_harness(name, box, prompt)`` inside a ``@rollout`` agent installs the
pinned CLI from the npm registry (once), points it at the rollout with only
its documented settings, runs it headless in the rollout's sandbox, and
marks the rollout so the coordinator stores the tools it ran from the
conversation. docs/harnesses.md shows a whole agent.
"""

from ._builtin import HARNESSES
from ._install import HarnessInstallError, harness_root, install_harness
from ._run import HarnessFailed, HarnessResult, run_harness
from ._spec import Harness, HarnessCall, Launch

__all__ = ["HARNESSES", "Harness", "HarnessCall", "HarnessFailed", "HarnessInstallError", "HarnessResult", "Launch",
           "harness_root", "install_harness", "run_harness"]
