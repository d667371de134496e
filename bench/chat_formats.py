"""Render + parse cost per turn of every chat format, against today's Hermes path, side by side in one run.

One turn is what the endpoint does around a generation: build the prompt
(``PromptBuilder.build``: two renders and the encoding of the new text, by
sequence extension), decode the completion, parse it with the format, and
advance the conversation state. A conversation is 6 turns (5 tool calls then
an answer, each call's arguments with nested JSON), replayed with the
completions a model of the family writes, each ended as an engine ends it
(the format's stop token where it writes one, gpt-oss ``<|call|>``, else
eos). ``extension_breaks`` lists the break reasons of turns that did not
extend (each costs a full render and encode): none is expected.

- baseline: the path before formats existed: the project's tiny tokenizer,
  its ChatML tools template, ``chat.parse_tool_calls``;
- ``hermes_chatml``: the same tokenizer and template as the baseline, parsed
  through the ``hermes`` format: the cost of the format layer alone;
- one row per format: the family's tokenizer (``testing_formats``) with the
  family's template (its own rendering cost: Mistral's tool list and JSON
  tool results, Qwen3's reasoning rule), the format's ``parse``.

Rounds interleave every path, so all see the same machine load; the figure
is the median per-turn time and its ratio to the baseline (goal: <= 1.2x).

    python bench/chat_formats.py                      # writes bench/results/chat_formats.json
    python bench/chat_formats.py --rounds 20 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from mtrl_runtime.chat import ChatRenderer, PromptBuilder, parse_tool_calls
from mtrl_runtime.chat.formats import CHAT_FORMATS
from mtrl_runtime.testing import tiny_tokenizer
from mtrl_runtime.testing_formats import FAMILY_TOKENS, answer_text, call_text, family_tokenizer

try:
    from _machine import load_note, machine_info
except ImportError:  # run as a module
    from bench._machine import load_note, machine_info

RESULTS = Path(__file__).parent / "results" / "chat_formats.json"
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a record up by key and filters",
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "filters": {"type": "object"}},
                         "required": ["key"]}}}]
TURNS = 6


def _args(i: int) -> dict[str, Any]:
    return {"key": f"K{i:02d}", "filters": {"range": [i, i + 10], "tags": ["a", "é"], "deep": {"x": {"y": i}}}}


def conversation_path(name: str | None) -> tuple[Callable[[], int], str]:
    """A function replaying one 6-turn conversation through format ``name`` (None: the baseline); returns turns."""
    if name is None:
        tok, fmt_name = tiny_tokenizer(), "hermes"
        renderer = ChatRenderer(tok)
        parse = lambda text: parse_tool_calls(text).to_message()  # noqa: E731
    elif name == "hermes_chatml":  # today's tokenizer and template, parsed through the hermes format
        tok, fmt_name = tiny_tokenizer(), "hermes"
        fmt = CHAT_FORMATS.get("hermes")
        renderer = ChatRenderer(tok, fallback=fmt.template, stop_tokens=fmt.stop_tokens,
                                history_terminators=fmt.history_terminators)
        parse = lambda text: fmt.parse(text).to_message()  # noqa: E731
    else:
        tok, fmt_name = family_tokenizer(name), name
        fmt = CHAT_FORMATS.get(name)
        renderer = ChatRenderer(tok, fallback=fmt.template, stop_tokens=fmt.stop_tokens,
                                history_terminators=fmt.history_terminators)
        parse = lambda text: fmt.parse(text).to_message()  # noqa: E731
    builder = PromptBuilder(renderer)
    completions = [call_text(fmt_name, [("lookup", _args(i))]) for i in range(TURNS - 1)]
    completions.append(answer_text(fmt_name, "All records are looked up; the total is 42."))
    # as an engine returns them: ended by the format's stop token where the text has one (gpt-oss <|call|>), else eos
    completion_ids = [ids if ids and ids[-1] in renderer.stop_token_ids else ids + (tok.eos_token_id,)
                      for ids in (tuple(tok.encode(c, add_special_tokens=False)) for c in completions)]
    eos = renderer.eos_token_ids

    def run() -> int:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You look records up."},
                                          {"role": "user", "content": "Look up K00 to K04 and sum them."}]
        state = None
        for turn, ids in enumerate(completion_ids):
            plan = builder.build(state, messages, TOOLS)
            if plan.break_reason is not None:
                breaks.append(plan.break_reason.value)
            body = list(ids)
            while body and body[-1] in eos:
                body.pop()
            message = parse(renderer.decode(body))
            state = builder.advance(state, plan, messages, TOOLS, ids, "stop", message)
            messages = [*messages, message]
            for call in message.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": "lookup", "content": f"{turn * 7}"})
        assert not message.get("tool_calls") and turn == TURNS - 1
        return TURNS

    breaks: list[str] = []  # turns that did not extend the previous one (a full render instead)
    run.breaks = breaks  # type: ignore[attr-defined]
    return run, fmt_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--reps", type=int, default=20, help="conversations per path per round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    paths = {"baseline_hermes_before": conversation_path(None)[0]}
    paths["hermes_chatml"] = conversation_path("hermes_chatml")[0]
    paths.update({name: conversation_path(name)[0] for name in sorted(FAMILY_TOKENS)})
    for run in paths.values():  # warm caches (compiled templates, segment encodings) and check each path works
        run()
    breaks = {name: sorted(set(run.breaks)) for name, run in paths.items()}  # type: ignore[attr-defined]
    load_before = os.getloadavg()
    per_turn: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, run in paths.items():
            start = time.perf_counter()
            for _ in range(args.reps):
                turns = run()
            per_turn[name].append((time.perf_counter() - start) / (args.reps * turns))
    load_after = os.getloadavg()
    base = statistics.median(per_turn["baseline_hermes_before"])
    rows = {
        name: {"per_turn_us_median": round(statistics.median(v) * 1e6, 1),
               "per_turn_us_p90": round(sorted(v)[int(0.9 * (len(v) - 1))] * 1e6, 1),
               "ratio_to_baseline": round(statistics.median(v) / base, 3),
               "extension_breaks": breaks[name]}
        for name, v in per_turn.items()
    }
    result = {
        "benchmark": "chat_formats",
        "what": "render (PromptBuilder.build, sequence extension) + decode + parse + advance, per turn of a 6-turn "
                "tool-calling conversation; median over interleaved rounds",
        "goal": "every format <= 1.2x the baseline",
        "rounds": args.rounds,
        "reps": args.reps,
        "rows": rows,
        "within_goal": all(r["ratio_to_baseline"] <= 1.2 for r in rows.values()),
        "machine": machine_info(load_before, load_after, threads=1, dtype="none (no model: chat rendering and parsing only)"),
        "load_note": load_note(load_before, load_after, "per-turn times are inflated for every path alike"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:24s} {row['per_turn_us_median']:8.1f} us/turn  x{row['ratio_to_baseline']:.3f}")
    print(result["load_note"], load_before, load_after)


if __name__ == "__main__":
    main()
