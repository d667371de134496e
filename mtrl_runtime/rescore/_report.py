"""The rescore report: one JSON document, rendered as Markdown and as a PNG plot (as the evaluator's report).

``report_data`` gathers a ``RescoreResult`` (per step, original and rescored
side by side, what the run logged, the reproduction check, the rollouts
whose reward changed, the strict scorer's disagreements); ``write_report``
writes ``rescore_report.json``, ``.md`` and ``.png`` into a folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..evaluation import ReportPaths, StrictComparison, disagreement_sections, markdown_row, number_text, table_cell
from ._rescore import REPRODUCED, RescoreResult, StepComparison

SIDES = ("original", "rescored")
MAX_LISTED = 50  # rollouts listed per table; the counts are always complete
# (figure, what the report calls it), per step and over the run
_FIGURES = (
    ("reward/mean", "mean reward"),
    ("reward/std", "reward std (sample)"),
    ("rollout/reward/zero_frac", "rollouts with reward 0"),
    ("analysis/equal_reward_groups", "groups with equal rewards"),
    ("analysis/zero_adv_frac", "zero-advantage share of groups"),
    ("advantages/abs_mean", "mean abs. advantage per rollout turn"),
    ("samples/count", "samples trained"),
    ("signal/tokens_trained", "tokens trained"),
    ("signal/nonzero_adv_frac", "generated tokens with nonzero advantage"),
    ("signal/abs_adv_sum", "sum of abs. advantage over trained tokens"),
    ("signal/abs_adv_per_token", "mean abs. advantage per trained token"),
    ("strict/disagree_frac", "disagrees with the strict scorer"),
    ("strict/reward_only_frac", "reward success, strict failure"),
    ("strict/strict_only_frac", "strict success, reward failure"),
)
_PER_STEP = (  # the per-step table's columns (the JSON holds every figure)
    ("reward/mean", "mean reward"),
    ("reward/std", "reward std"),
    ("analysis/zero_adv_frac", "zero-advantage groups"),
    ("signal/tokens_trained", "tokens trained"),
    ("signal/nonzero_adv_frac", "tokens with advantage"),
    ("signal/abs_adv_sum", "sum of abs. advantage"),
    ("strict/disagree_frac", "strict disagrees"),
)
_COUNTS = frozenset({"analysis/equal_reward_groups", "analysis/zero_adv_groups", "samples/count",
                     "signal/tokens_trained", "signal/tokens_generated", "signal/tokens_nonzero_adv"})
_QUANTILES = ("reward/min", "reward/p10", "reward/p25", "reward/p50", "reward/p75", "reward/p90", "reward/max")


def report_data(result: RescoreResult) -> dict[str, Any]:
    """The whole report as JSON-able data."""
    run = result.run
    changes = [c for s in result.steps for c in s.changes]
    data: dict[str, Any] = {
        "settings": {
            "run": str(run.folder),
            "config": run.config_source,
            "reward": result.reward,
            "advantage_method": {"original": result.original_method, "rescored": result.method},
            "success_threshold": result.params.success_threshold,
            "group_size": run.config.core.group_size,
            "group_policy": run.config.advanced.group_policy.on_failure,
            "strict": result.strict,
            "steps": [s.step for s in result.steps],
        },
        "reproduced": result.reproduced,
        "checked_steps": [s.step for s in result.steps if s.logged],
        "mismatches": [m.to_dict() for m in result.mismatches],
        "totals": {side: _totals(result.steps, side) for side in SIDES},
        "steps": [_step_data(s) for s in result.steps],
        "changed_count": len(changes),
        "changed": [c.to_dict() for c in changes[:MAX_LISTED]],
        "kept_recorded": sum(s.kept_recorded for s in result.steps),
    }
    if result.strict is not None:
        data["strict"] = {side: _strict_data([_strict(s, side) for s in result.steps]) for side in SIDES}
    return data


def _strict(step: StepComparison, side: str) -> StrictComparison | None:
    return step.strict_original if side == "original" else step.strict_rescored


def _step_data(step: StepComparison) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step.step, "changed_rollouts": len(step.changes),
                           "kept_recorded": step.kept_recorded,
                           "logged": {k: v for k, v in step.logged.items()
                                      if k in REPRODUCED or k.startswith("train/")}}
    for side in SIDES:
        figures = (step.original if side == "original" else step.rescored).summary()
        strict = _strict(step, side)
        if strict is not None:
            figures.update({k.removeprefix("rollout/"): v for k, v in strict.metrics((), prefix="rollout").items()})
        out[side] = figures
    return out


def _totals(steps: Sequence[StepComparison], side: str) -> dict[str, float]:
    """Over every step: rewards pooled, group and token counts summed."""
    signals = [s.original if side == "original" else s.rescored for s in steps]
    rewards = [x for sig in signals for x in sig.rewards]
    generated = sum(sig.tokens_generated for sig in signals)
    trained = sum(sig.tokens_trained for sig in signals)
    nonzero = sum(sig.tokens_signal for sig in signals)
    return {
        "reward/mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "analysis/zero_adv_groups": sum(sig.metrics.get("analysis/zero_adv_groups", 0.0) for sig in signals),
        "analysis/equal_reward_groups": sum(sig.metrics.get("analysis/equal_reward_groups", 0.0) for sig in signals),
        "samples/count": sum(sig.metrics.get("samples/count", 0.0) for sig in signals),
        "signal/tokens_trained": float(trained),
        "signal/nonzero_adv_frac": nonzero / generated if generated else 0.0,
        "signal/abs_adv_sum": sum(sig.abs_adv_sum for sig in signals),
    }


def _strict_data(comparisons: Sequence[StrictComparison | None]) -> dict[str, Any]:
    found = [c for c in comparisons if c is not None]
    reward_only = [d for c in found for d in c.reward_only]
    strict_only = [d for c in found for d in c.strict_only]
    total = sum(c.rollouts for c in found)
    return {
        "scorer": found[0].scorer if found else None,
        "rollouts": total,
        "disagree_frac": (len(reward_only) + len(strict_only)) / total if total else 0.0,
        "reward_only_count": len(reward_only),
        "strict_only_count": len(strict_only),
        "reward_only": [d.to_dict() for d in reward_only[:MAX_LISTED]],
        "strict_only": [d.to_dict() for d in strict_only[:MAX_LISTED]],
    }


def write_report(data: Mapping[str, Any], folder: str | Path) -> ReportPaths:
    """Write ``rescore_report.json``, ``.md`` and ``.png`` into ``folder`` (created if missing)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(folder / "rescore_report.md", folder / "rescore_report.json", folder / "rescore_report.png")
    paths.json.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    paths.markdown.write_text(render_markdown(data), encoding="utf-8")
    plot_report(data, paths.plot)
    return paths


# -- Markdown ----------------------------------------------------------------------------------


def render_markdown(data: Mapping[str, Any]) -> str:
    s = data["settings"]
    methods = s["advantage_method"]
    method = methods["original"] if methods["original"] == methods["rescored"] else \
        f"{methods['original']} (original) vs {methods['rescored']} (rescored)"
    lines = [
        f"# mtrl rescore: {s['run']}",
        "",
        f"Reward `{s['reward']}` over the run's stored rollouts of {_steps_text(s['steps'])}; advantages "
        f"{method}; group size {s['group_size']}, group policy {s['group_policy']}, success: reward >= "
        f"{s['success_threshold']}; run config from {s['config']}. Nothing was generated.",
        "",
        *_reproduction(data),
        "",
        "## Summary (all steps)",
        "",
        markdown_row(["figure", *SIDES, "change"]),
        markdown_row(["---"] * 4),
    ]
    for key, name in _FIGURES:
        values = [data["totals"][side].get(key) for side in SIDES]
        if all(v is None for v in values):
            continue
        lines.append(markdown_row([name, *(_figure(key, v) for v in values), _delta(key, values)]))
    lines += [f"\n{data['changed_count']} completed rollouts score differently under `{s['reward']}`."]
    if data["kept_recorded"]:
        lines.append(f"{data['kept_recorded']} rollouts did not complete; they keep the reward the run gave them "
                     "(the agent never scored them).")
    lines += ["", "## Per step (original / rescored)", ""]
    shown = [(k, n) for k, n in _PER_STEP if any(k in st["original"] for st in data["steps"])]
    lines += [markdown_row(["step", *(n for _, n in shown)]), markdown_row(["---"] * (len(shown) + 1))]
    for st in data["steps"]:
        lines.append(markdown_row([str(st["step"]), *(
            f"{_figure(k, st['original'].get(k))} / {_figure(k, st['rescored'].get(k))}" for k, _ in shown)]))
    lines += ["", "## Reward distribution per step", "",
              markdown_row(["step", "side", *(q.split("/")[1] for q in _QUANTILES)]),
              markdown_row(["---"] * (len(_QUANTILES) + 2))]
    for st in data["steps"]:
        for side in SIDES:
            lines.append(markdown_row([str(st["step"]), side, *(number_text(st[side].get(q)) for q in _QUANTILES)]))
    lines += _changed_section(data)
    if "strict" in data:
        lines += _strict_section(data["strict"]["rescored"], s["reward"])
    return "\n".join(lines) + "\n"


def _reproduction(data: Mapping[str, Any]) -> list[str]:
    checked = data["checked_steps"]
    if not checked:
        return ["No step of this run was committed (no checkpoint after it): nothing logged to check the original "
                "side against."]
    if data["reproduced"]:
        return [f"The original side reproduces what the run logged at {_steps_text(checked)} "
                "(rewards, zero-advantage groups, advantage summaries, samples, trained tokens and rollouts)."]
    lines = ["**The original side does not reproduce what the run logged**: the batches were rebuilt differently "
             "(a resumed step, an edited store, a config other than the run's); read the comparison with care.", "",
             markdown_row(["step", "figure", "logged", "recomputed"]), markdown_row(["---"] * 4)]
    lines += [markdown_row([str(m["step"]), m["name"], table_cell(str(m["logged"])), table_cell(str(m["recomputed"]))])
              for m in data["mismatches"][:MAX_LISTED]]
    return lines


def _changed_section(data: Mapping[str, Any]) -> list[str]:
    if not data["changed"]:
        return []
    lines = ["", f"## Rollouts whose reward changed: {data['changed_count']}", "",
             markdown_row(["rollout", "task", "group", "original", "rescored", "final answer"]),
             markdown_row(["---"] * 6)]
    lines += [markdown_row([c["rollout_id"], c["task_id"], c["group_id"], number_text(c["original"]),
                            number_text(c["rescored"]), table_cell(c["final_answer"])]) for c in data["changed"]]
    if data["changed_count"] > len(data["changed"]):
        lines.append(f"\n(first {len(data['changed'])} of {data['changed_count']} listed)")
    return lines


def _strict_section(strict: Mapping[str, Any], reward: str) -> list[str]:
    lines = ["", f"## Strict scorer `{strict['scorer']}` vs `{reward}`", "",
             f"{number_text(strict['disagree_frac'])} of {strict['rollouts']} rollouts disagree."]
    return lines + disagreement_sections(strict, "the reward says success, strict says no (a loophole to close)")


def _steps_text(steps: Sequence[int]) -> str:
    """``step 3``, ``steps 0..9`` (a run of three or more) or ``steps 1, 4``."""
    if not steps:
        return "no step"
    if len(steps) == 1:
        return f"step {steps[0]}"
    consecutive = list(steps) == list(range(steps[0], steps[-1] + 1))
    return f"steps {steps[0]}..{steps[-1]}" if consecutive and len(steps) > 2 else "steps " + ", ".join(map(str, steps))


def _delta(key: str, values: Sequence[Any]) -> str:
    if None in values:
        return "-"
    return f"{values[1] - values[0]:+.0f}" if key in _COUNTS else f"{values[1] - values[0]:+.3f}"


def _figure(key: str, value: Any) -> str:
    """A count as an integer, anything else as the evaluator's report writes numbers."""
    return str(int(value)) if key in _COUNTS and value is not None else number_text(value)


# -- plot --------------------------------------------------------------------------------------


def plot_report(data: Mapping[str, Any], path: str | Path) -> Path:
    """Per step, original vs rescored: mean reward (with its p25..p75 band), the zero-advantage share of
    groups, the share of generated tokens with a nonzero advantage, and the strict disagreement (or the
    sum of |advantage|), as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    steps = data["steps"]
    xs = [st["step"] for st in steps]
    last = ("strict/disagree_frac", "disagrees with the strict scorer") if "strict" in data else \
        ("signal/abs_adv_sum", "sum of abs. advantage over trained tokens")
    panels = (("reward/mean", "mean reward"), ("analysis/zero_adv_frac", "zero-advantage share of groups"),
              ("signal/nonzero_adv_frac", "tokens with nonzero advantage"), last)
    fig = Figure(figsize=(10, 7), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2).flatten()
    for ax, (key, title) in zip(axes, panels):
        for side, style in zip(SIDES, ("-o", "--s")):
            (line,) = ax.plot(xs, [st[side].get(key, 0.0) for st in steps], style, label=side)
            if key == "reward/mean":
                ax.fill_between(xs, [st[side]["reward/p25"] for st in steps], [st[side]["reward/p75"] for st in steps],
                                color=line.get_color(), alpha=0.12, label=f"{side} p25..p75")
        if key.endswith("frac"):
            ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"rescore: {data['settings']['reward']}")
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return Path(path)


__all__ = ["plot_report", "render_markdown", "report_data", "write_report"]
