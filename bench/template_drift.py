"""Train/serve drift and token cost on the aircraft example (hermes), thinking on and off, each history setting.

The aircraft inspection example's real Strands agent runs on ``N`` train
aircraft through mtrl's endpoint (``collect_rollouts``: the training stack,
one rollout per aircraft). The policy is the scripted engine replaying the
reference solver's SOP episode (six tool calls, then the answer) in the
``hermes`` format, with a ``<think>`` block before every reply ("thinking
on") or none ("off"). The tokenizer is SmolLM2-135M's with the Qwen3 chat
template (``chat.formats.QWEN3_TEMPLATE``: the hermes format's template that
drops earlier turns' thinking, as Qwen3 deploys); Strands, like LangGraph,
does not send ``reasoning_content`` back, so thinking is not in the history
the agent sends.

For each of thinking off/on x ``advanced.history_training`` extend/deployed,
in one run, it reports:

- ``mtrl check template``'s figures on the run's store (``check_template``):
  the fraction of trained tokens that differ from the deployment rendering,
  and how many segments differ;
- the token cost of training them: samples (segments), trained sequence
  tokens (what the update computes) and model tokens (the loss mask), per
  rollout, and the ratio of deployed to extend.

    python bench/template_drift.py                  # writes bench/results/template_drift.json
    python bench/template_drift.py --aircraft 4 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the examples package

from mtrl_runtime.algorithms.samples import build_samples  # noqa: E402
from mtrl_runtime.chat.formats import QWEN3_TEMPLATE  # noqa: E402
from mtrl_runtime.checks import check_template  # noqa: E402
from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.engines import ScriptedEngine, resolve_model  # noqa: E402
from mtrl_runtime.rollouts import collect_rollouts, load_tasks  # noqa: E402
from mtrl_runtime.testing_formats import call_text  # noqa: E402

try:
    from _machine import load_note, machine_info
except ImportError:  # run as a module
    from bench._machine import load_note, machine_info

RESULTS = Path(__file__).parent / "results" / "template_drift.json"
AIRCRAFT_CONFIG = REPO / "examples" / "aircraft_inspection" / "config.yaml"
_REQUEST = re.compile(r"Inspect aircraft (N[0-9A-Z]+)")


def sop_policy(thinking: bool) -> Any:
    """The reference solver's episode for the aircraft the prompt asks about, with a <think> block per reply or not."""
    from examples.aircraft_inspection import format_answer, solve

    def policy(request: Any, prompt: str) -> Any:
        tail = _REQUEST.findall(prompt)[-1]  # the last request: the worked example's comes first
        episode = solve({"id": tail, "data": {"tail_number": tail}})
        replies = [m for m in episode.messages if m["role"] == "assistant"]
        reply = replies[min(request.turn_index, len(replies) - 1)]
        think = (f"<think>\nStep {request.turn_index + 1} of the SOP for {tail}: check what the last tool "
                 f"returned, then {'call the next tool' if reply.get('tool_calls') else 'answer'}.\n</think>\n\n"
                 if thinking else "")
        if reply.get("tool_calls"):  # the step line, then the call, as a Qwen3 model writes them
            fn = reply["tool_calls"][0]["function"]
            return think + call_text("hermes", [(fn["name"], json.loads(fn["arguments"]))], content=reply["content"] or "")
        return think + (reply["content"] or format_answer(episode.answer))

    return policy


def model_folder(root: Path) -> Path:
    """SmolLM2-135M's tokenizer with the Qwen3 template, saved where ``check_template`` reads a model."""
    from transformers import AutoTokenizer

    source = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = QWEN3_TEMPLATE
    folder = root / "smollm2-qwen3-template"
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text((source / "config.json").read_text())
    return folder


def measure(folder: Path, run_dir: Path, tasks: list, thinking: bool, history: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from examples.aircraft_inspection.agent import run

    config = MtrlConfig.from_yaml(AIRCRAFT_CONFIG).with_overrides({
        "core.model": str(folder), "core.run_dir": str(run_dir), "core.group_size": 1,
        "core.sampling_params.max_tokens": 512, "advanced.history_training": history,
        "advanced.chat_format": "hermes", "advanced.rollout_timeout_s": 120,
    })
    engine = ScriptedEngine(AutoTokenizer.from_pretrained(folder), sop_policy(thinking))
    started = time.perf_counter()
    collected = asyncio.run(collect_rollouts(config, run, tasks, engine=engine))
    seconds = time.perf_counter() - started
    rollouts = collected.rollouts
    report = check_template(collected.store_path, str(folder), "hermes")
    samples = [s for r in rollouts for s in build_samples(r, [1.0] * len(r.turns))]
    n = len(rollouts)
    return {
        "rollouts": n,
        "completed": sum(r.status.value == "completed" for r in rollouts),
        "turns_per_rollout": round(sum(len(r.turns) for r in rollouts) / n, 2),
        "reasoning_tokens_per_rollout": round(sum(t.reasoning_tokens for r in rollouts for t in r.turns) / n, 1),
        "drift_fraction": round(report.drift_fraction, 4),
        "segments": len(report.segments),
        "segments_differing": sum(not s.equal for s in report.segments),
        "samples_per_rollout": round(len(samples) / n, 2),
        "trained_tokens_per_rollout": round(sum(len(s.token_ids_T) for s in samples) / n, 1),
        "model_tokens_per_rollout": round(sum(sum(s.loss_mask_T) for s in samples) / n, 1),
        "first_difference": next((s.first_difference for s in report.segments if not s.equal), None),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aircraft", type=int, default=8, help="train aircraft, one rollout each")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    from examples.aircraft_inspection import load_instances

    tasks = load_tasks(load_instances("train")[: args.aircraft])
    load_before = os.getloadavg()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(Path(tmp))
        for thinking in (False, True):
            for history in ("extend", "deployed"):
                name = f"thinking_{'on' if thinking else 'off'}/{history}"
                rows[name] = measure(folder, Path(tmp) / name.replace("/", "-"), tasks, thinking, history)
                print(name, {k: v for k, v in rows[name].items() if k != "first_difference"}, flush=True)
    load_after = os.getloadavg()
    for thinking in ("off", "on"):
        extend, deployed = rows[f"thinking_{thinking}/extend"], rows[f"thinking_{thinking}/deployed"]
        deployed["trained_tokens_vs_extend"] = round(
            deployed["trained_tokens_per_rollout"] / extend["trained_tokens_per_rollout"], 3)
    result = {
        "benchmark": "template_drift",
        "what": "the aircraft example's Strands agent, scripted SOP episodes in the hermes format (Qwen3 template, "
                "SmolLM2 tokenizer), thinking off/on x history_training extend/deployed: mtrl check template's drift "
                "and the tokens training them costs",
        "aircraft": args.aircraft,
        "rows": rows,
        "machine": machine_info(load_before, load_after, threads=1, dtype="none (scripted engine: no model runs)"),
        "load_note": load_note(load_before, load_after, "the drift and token figures do not depend on load"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["load_note"], load_before, load_after)


if __name__ == "__main__":
    main()
