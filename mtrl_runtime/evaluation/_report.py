"""The evaluation report: one JSON document, rendered as Markdown and as a PNG plot.

``report_data`` gathers what an evaluation found (per model: metrics,
pass@k, tool calls, reward-function metrics, per-task successes, and the
trajectories the strict scorer disputes); ``write_report`` writes
``eval_report.json``, ``eval_report.md`` and ``eval_report.png`` into a
folder. The plot uses matplotlib's Agg canvas directly (no pyplot state, no
display needed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ._metrics import reward_metric_means, tool_call_distribution
from ._run import BASE, FINE_TUNED, EvalPlan, EvalSide

MAX_LISTED = 50  # disputed trajectories listed per kind and model; the counts are always complete
_SUMMARY = (
    ("reward/mean", "mean reward"),
    ("reward/success_rate", "success rate"),
    ("completed_frac", "completed"),
    ("turn_limit_frac", "turn budget exhausted"),
    ("truncated_frac", "responses at the token cap"),
    ("turns/mean", "turns per rollout"),
    ("tool_calls/mean", "tool calls per rollout"),
    ("strict/success_rate", "strict success rate"),
    ("strict/reward_only_frac", "reward success, strict failure"),
    ("strict/strict_only_frac", "strict success, reward failure"),
)


@dataclass(frozen=True)
class ReportPaths:
    markdown: Path
    json: Path
    plot: Path

    @property
    def folder(self) -> Path:
        return self.json.parent


def report_data(sides: Sequence[EvalSide], plan: EvalPlan, prefix: str = "val") -> dict[str, Any]:
    """The whole report as JSON-able data."""
    return {
        "settings": {
            "tasks": len(plan.tasks),
            "samples_per_task": plan.samples,
            "pass_k_values": list(plan.pass_k_values),
            "success_threshold": plan.success_threshold,
            "seed": plan.seed,
            "sampling": plan.sampling.model_dump(),
            "task_ids": [t.id for t in plan.tasks],
        },
        "models": {side.label: _side_data(side, prefix) for side in sides},
    }


def _side_data(side: EvalSide, prefix: str) -> dict[str, Any]:
    pass_prefix = f"{prefix}/reward/pass_k_"
    per_task: dict[str, dict[str, Any]] = {}
    for record in side.records:
        entry = per_task.setdefault(record.task_id, {"samples": 0, "successes": 0, "reward_sum": 0.0})
        entry["samples"] += 1
        entry["successes"] += int(record.success)
        entry["reward_sum"] += record.reward
    data: dict[str, Any] = {
        "model": side.model,  # a reference model's name; None: the policy the engine served
        "policy_version": side.policy_version,
        "rollouts": len(side.rollouts),
        "metrics": dict(side.metrics),
        "pass_k": {k[len(pass_prefix):]: v for k, v in side.metrics.items() if k.startswith(pass_prefix)},
        "tool_calls": tool_call_distribution(side.records),
        "reward_metrics": reward_metric_means(side.records),
        "per_task": {
            tid: {"samples": e["samples"], "successes": e["successes"], "mean_reward": e["reward_sum"] / e["samples"]}
            for tid, e in per_task.items()
        },
    }
    if side.strict is not None:
        data["strict"] = {
            "scorer": side.strict.scorer,
            "success_rate": side.strict.success_rate,
            "reward_only_count": len(side.strict.reward_only),
            "strict_only_count": len(side.strict.strict_only),
            "reward_only": [d.to_dict() for d in side.strict.reward_only[:MAX_LISTED]],
            "strict_only": [d.to_dict() for d in side.strict.strict_only[:MAX_LISTED]],
        }
    return data


def write_report(data: Mapping[str, Any], folder: str | Path, prefix: str = "val") -> ReportPaths:
    """Write ``eval_report.json``, ``.md`` and ``.png`` into ``folder`` (created if missing)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(folder / "eval_report.md", folder / "eval_report.json", folder / "eval_report.png")
    paths.json.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    paths.markdown.write_text(render_markdown(data, prefix), encoding="utf-8")
    plot_report(data, paths.plot)
    return paths


# -- Markdown ----------------------------------------------------------------------------------


def render_markdown(data: Mapping[str, Any], prefix: str = "val") -> str:
    settings, models = data["settings"], data["models"]
    labels = list(models)
    s = settings["sampling"]
    lines = [
        "# mtrl evaluation",
        "",
        f"{settings['tasks']} tasks x {settings['samples_per_task']} samples, temperature {s['temperature']}, "
        f"top_p {s['top_p']}, max_tokens {s['max_tokens']} per turn; seeds derived from seed {settings['seed']} "
        f"(the same for every model). Success: reward >= {settings['success_threshold']}.",
    ]
    lines += [f"\n`{label}` is the reference model `{models[label]['model']}` behind its own endpoint: the same agent, "
              "tasks and seeds, its calls passed through and recorded (no token ids), never trained."
              for label in labels if models[label].get("model")]
    change = FINE_TUNED in labels and BASE in labels  # the change column: fine-tuned minus base
    lines += [
        "",
        "## Summary",
        "",
        markdown_row(["metric", *labels] + (["change"] if change else [])),
        markdown_row(["---"] * (len(labels) + 1 + change)),
    ]
    for key, name in _SUMMARY:
        values = [models[m]["metrics"].get(f"{prefix}/{key}") for m in labels]
        if all(v is None for v in values):
            continue
        delta = [_delta([models[m]["metrics"].get(f"{prefix}/{key}") for m in (FINE_TUNED, BASE)])] if change else []
        lines.append(markdown_row([name, *map(number_text, values)] + delta))
    lines += ["", "## pass@k", "", markdown_row(["k", *labels]), markdown_row(["---"] * (len(labels) + 1))]
    ks = sorted({int(k) for m in labels for k in models[m]["pass_k"]})
    for k in ks:
        lines.append(markdown_row([str(k), *(number_text(models[m]["pass_k"].get(str(k))) for m in labels)]))
    lines += _table("Tool calls (share of all calls)", models, "tool_calls")
    lines += _table("Reward function metrics (mean)", models, "reward_metrics")
    for label in labels:
        lines += _strict_section(label, models[label].get("strict"))
    return "\n".join(lines) + "\n"


def _table(title: str, models: Mapping[str, Any], key: str) -> list[str]:
    names = sorted({n for m in models.values() for n in m[key]})
    if not names:
        return []
    labels = list(models)
    lines = ["", f"## {title}", "", markdown_row(["name", *labels]), markdown_row(["---"] * (len(labels) + 1))]
    lines += [markdown_row([n, *(number_text(models[m][key].get(n)) for m in labels)]) for n in names]
    return lines


def _strict_section(label: str, strict: Mapping[str, Any] | None) -> list[str]:
    if strict is None:
        return []
    lines = ["", f"## Strict scorer `{strict['scorer']}` vs the reward: {label}", "",
             f"Strict success rate {number_text(strict['success_rate'])}."]
    return lines + disagreement_sections(strict, "reward says success, strict says no (suspected reward hacking)",
                                         "eval_report.json")


def disagreement_sections(strict: Mapping[str, Any], reward_only: str, counted_in: str | None = None) -> list[str]:
    """The trajectories the reward and the strict scorer judge differently, in Markdown: per kind (the reward's
    success alone, titled ``reward_only``, then the strict scorer's) a heading with its count and a table of those
    listed. ``counted_in``: where all are counted, said when only the first are listed."""
    lines: list[str] = []
    for kind, title in (("reward_only", reward_only), ("strict_only", "strict says success, the reward does not")):
        count, listed = strict[f"{kind}_count"], strict[kind]
        lines += ["", f"### {title}: {count} trajectories"]
        if not listed:
            continue
        lines += ["", markdown_row(["rollout", "task", "reward", "strict", "final answer"]), markdown_row(["---"] * 5)]
        lines += [markdown_row([d["rollout_id"], d["task_id"], number_text(d["reward"]), number_text(d["strict"]),
                                table_cell(d["final_text"])])
                  for d in listed]
        if counted_in is not None and count > len(listed):
            lines.append(f"\n(first {len(listed)} of {count} listed; all are in {counted_in}'s counts)")
    return lines


def markdown_row(cells: Sequence[str]) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(cells) + " |"


def number_text(value: Any) -> str:
    """A number to three decimals; "-" for None."""
    return "-" if value is None else f"{value:.3f}"


def _delta(values: Sequence[Any]) -> str:
    return "-" if None in values else f"{values[0] - values[1]:+.3f}"


def table_cell(text: str, limit: int = 160) -> str:
    """Free text as one table cell: whitespace folded, pipes escaped, cut at ``limit`` characters."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- plot --------------------------------------------------------------------------------------


def plot_report(data: Mapping[str, Any], path: str | Path, prefix: str = "val") -> Path:
    """pass@k per model (left) and the main rates per model (right), as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = data["models"]
    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for label, model in models.items():
        points = sorted((int(k), v) for k, v in model["pass_k"].items())
        if points:
            left.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label)
    left.set_xscale("log", base=2)
    ks = sorted({int(k) for model in models.values() for k in model["pass_k"]})
    if ks:
        left.set_xticks(ks, [str(k) for k in ks])
        left.minorticks_off()
    left.set_ylim(0, 1.05)
    left.set_xlabel("k")
    left.set_ylabel("pass@k")
    left.set_title("pass@k")
    left.grid(alpha=0.3)
    left.legend()
    rates = [(key, name) for key, name in _SUMMARY if key.endswith(("frac", "rate", "mean")) and key != "turns/mean"
             and key != "tool_calls/mean" and any(f"{prefix}/{key}" in m["metrics"] for m in models.values())]
    width = 0.8 / max(len(models), 1)
    for i, (label, model) in enumerate(models.items()):
        xs = [j + i * width for j in range(len(rates))]
        right.bar(xs, [model["metrics"].get(f"{prefix}/{key}", 0.0) for key, _ in rates], width, label=label)
    right.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(rates))])
    right.set_xticklabels([name for _, name in rates], rotation=30, ha="right", fontsize=7)
    right.set_ylim(0, 1.05)
    right.set_title("rates")
    right.legend()
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return Path(path)


__all__ = [
    "MAX_LISTED",
    "ReportPaths",
    "markdown_row",
    "number_text",
    "plot_report",
    "render_markdown",
    "report_data",
    "table_cell",
    "write_report",
]
