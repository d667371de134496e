"""Teacher-forced probe of the answer step: does the model copy the tools' values or the worked example's?

For each instance the model reads the reference episode up to the answer;
for each field, the answer with that field's every allowed value (the other
fields right) is scored, and the probability of the right one is reported,
split by whether the right value agrees with the worked example's answer.
A model that copies the example scores high on "agree" and near 0 on
"differ"; one that reads the tools scores high on both.

    python -m examples.aircraft_inspection.probe --split val --n 25
    python -m examples.aircraft_inspection.probe --hide-findings   # the report without its findings

Needs the real model (``smollm2-135m`` or a folder) and takes about two
minutes for 25 instances on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
from collections import defaultdict
from typing import Any, Sequence

from .data import DEFAULT_EXAMPLE, example_instance, load_instances
from .prompts import build_messages
from .reward import FIELD_VALUES, FIELDS, format_answer
from .solver import solve
from .tools import TOOL_SPECS


def _hide_findings(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with every report's ``findings={...}`` removed (the report as it was before)."""
    return [{**m, "content": re.sub(r" findings=\{.*?\}", "", m["content"])} if m["role"] == "tool" else m
            for m in messages]


class AnswerScorer:
    """Log-probabilities of candidate final messages after one conversation, its prompt run once."""

    def __init__(self, model: Any, renderer: Any, messages: list[dict[str, Any]]) -> None:
        import torch

        self._torch, self._model, self._renderer = torch, model, renderer
        prompt = renderer.encode(renderer.render(messages, list(TOOL_SPECS)))
        with torch.no_grad():
            out = model(torch.tensor([prompt]), use_cache=True)
        self._cache = out.past_key_values
        self._first = torch.log_softmax(out.logits[0, -1].float(), -1)

    def logprob(self, text: str) -> float:
        torch = self._torch
        ids = self._renderer.encode(text)
        with torch.no_grad():
            out = self._model(torch.tensor([ids]), past_key_values=copy.deepcopy(self._cache), use_cache=True)
        logprobs = torch.log_softmax(out.logits[0].float(), -1)
        return self._first[ids[0]].item() + sum(logprobs[i, t].item() for i, t in enumerate(ids[1:]))


def probe(model: Any, renderer: Any, rows: Sequence[dict[str, Any]], hide_findings: bool = False,
          example: str = DEFAULT_EXAMPLE) -> dict[tuple[str, bool], list[float]]:
    """Per (field, agrees with the example): P(right value | other fields right), one entry per row."""
    example_answer = solve(example_instance(example)).answer
    found: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for row in rows:
        episode = list(solve(row).messages)
        messages = build_messages(row, example=example) + episode[:-1]
        scorer = AnswerScorer(model, renderer, _hide_findings(messages) if hide_findings else messages)
        head = episode[-1]["content"].split("<final_output>")[0]  # the step line
        truth = {name: row["ground_truth"][name] for name in FIELDS}
        for name in FIELDS:
            scores = {value: scorer.logprob(f"{head}{format_answer({**truth, name: value})}<|im_end|>")
                      for value in FIELD_VALUES[name]}
            top = max(scores.values())
            norm = top + math.log(sum(math.exp(s - top) for s in scores.values()))
            found[(name, truth[name] == example_answer[name])].append(math.exp(scores[truth[name]] - norm))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.aircraft_inspection.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--split", default="val")
    parser.add_argument("--n", type=int, default=25, help="instances to probe")
    parser.add_argument("--hide-findings", action="store_true", help="remove the findings from the report")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mtrl_runtime.chat import ChatRenderer
    from mtrl_runtime.engines import resolve_model

    torch.set_num_threads(args.threads)
    folder = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    found = probe(model, ChatRenderer(tokenizer), load_instances(args.split)[: args.n], args.hide_findings)
    print(f"P(right value | other fields right), {args.n} {args.split} instances, "
          f"report {'without' if args.hide_findings else 'with'} findings")
    for name in FIELDS:
        cells = []
        for agrees in (True, False):
            values = found.get((name, agrees), [])
            label = "agrees with the example" if agrees else "differs"
            cells.append(f"{label}: n={len(values):2d} P={sum(values) / len(values):.2f}" if values else f"{label}: n= 0")
        print(f"  {name:18s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
