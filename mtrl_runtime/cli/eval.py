"""``mtrl eval`` and ``mtrl check reward|env``: evaluate a policy, check a reward and an environment.

``mtrl check template`` and ``mtrl check budget`` live in their own modules
(``check_template``, ``check_budget``); this parser adds them.

The same conventions as ``mtrl train``: a YAML config first, the agent as
``--agent module:function`` or ``--agent path/to/file.py:function`` (the
``@rollout`` entrypoint; for ``mtrl eval`` also a deployed AgentCore Runtime's ARN), tasks as ``--dataset tasks.jsonl``. A strict
scorer is named the same way (``--strict module:function``, called as
``fn(final_text, ground_truth) -> float``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import check_budget, check_template
from ..run_folder import RunFolder
from ..task_sources import SOURCE_HELP
from ._agents import AGENT_HELP, agent_env_for, load_agent, load_strict_scorer
from ._command import Command
from ._stopping import marked_interrupted, marked_line, run_until_stopped


def _common(p: argparse.ArgumentParser, deployed: bool = False) -> None:
    """The flags eval and the checks share; ``deployed``: ``--agent`` may be an AgentCore Runtime ARN (or absent)."""
    p.add_argument("config", help="a YAML config (core + advanced)")
    if deployed:
        p.add_argument("--agent", help=AGENT_HELP)
    else:
        p.add_argument("--agent", required=True, help="the agent entrypoint: module:function or file.py:function")
    p.add_argument("--dataset", required=True, help=SOURCE_HELP)
    p.add_argument("--split", help="only the tasks whose 'split' is this (e.g. test)")
    p.add_argument("--run-dir", help="the run folder (overrides core.run_dir)")
    p.add_argument("--output", help="where reports and trajectories go (default: under the run folder)")


# the names of coordinator._reference.REFERENCE_WIRES, spelled here so that --help imports no runtime (a test keeps
# them equal)
REFERENCE_PROTOCOLS = ("openai", "responses", "anthropic", "bedrock", "gemini")


def _config(args: argparse.Namespace) -> Any:
    from ..config import MtrlConfig

    config = MtrlConfig.from_yaml(args.config)
    return config.with_overrides({"core.run_dir": args.run_dir}) if args.run_dir else config


def _scorer(spec: str | None) -> Any:
    return load_strict_scorer(spec) if spec else None


# -- mtrl eval ----------------------------------------------------------------------------------


def _eval_args(p: argparse.ArgumentParser) -> None:
    _common(p, deployed=True)
    p.add_argument("--adapter", help="a peft adapter folder (default: <run_dir>/adapter when it exists)")
    p.add_argument("--base", action="store_true", help="also evaluate the base model on the same tasks and seeds")
    p.add_argument("--strict", help="a strict scorer module:function, compared with the reward")
    p.add_argument("--samples", type=int, help="cap on samples per task (k = max(pass_k_values) by default)")
    p.add_argument("--max-tasks", type=int, help="evaluate only the first N tasks")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--reference-url", metavar="URL",
                   help="the base URL of an endpoint serving a reference model (OpenAI-compatible: .../v1): the same "
                        "agent, tasks and seeds run on it too, its calls recorded, never trained")
    p.add_argument("--reference-model", metavar="NAME", help="the reference model's name at --reference-url")
    p.add_argument("--reference-api-key-env", metavar="VAR",
                   help="the environment variable holding --reference-url's API key (never written anywhere)")
    p.add_argument("--reference-protocol", choices=REFERENCE_PROTOCOLS, default="openai",
                   help="what --reference-url speaks: OpenAI chat completions (default), OpenAI Responses (the "
                        "same .../v1 URL), Anthropic Messages (the URL "
                        "is the API root, e.g. https://api.anthropic.com) or Bedrock Converse (the runtime's root, "
                        "e.g. https://bedrock-runtime.us-east-1.amazonaws.com; an API key, or AWS credentials)")
    p.add_argument("--heartbeat", type=float, default=30.0, metavar="SECONDS",
                   help="off a terminal, print the rollouts done/total at least this often (default 30)")


def _eval(args: argparse.Namespace) -> int:
    from ..evaluation import MultiTurnRLEvaluator

    config = _config(args)
    adapter = args.adapter
    if adapter is None:
        adapter = config.run_folder.saved_adapter()
    evaluator = MultiTurnRLEvaluator(
        agent_env=agent_env_for(args.agent, config), dataset=args.dataset, config=config, output_path=args.output,
        adapter=adapter, evaluate_base_model=args.base, strict_scorer=_scorer(args.strict), split=args.split,
        max_tasks=args.max_tasks, max_samples=args.samples, tracking=not args.no_mlflow, reference=_reference(args),
    )
    store = RunFolder(evaluator.output_path).store
    try:
        result = run_until_stopped(
            "eval", args.heartbeat, lambda heartbeat_s: evaluator.evaluate(progress=True, heartbeat_s=heartbeat_s),
            lambda since: marked_line("evaluation ", *marked_interrupted(config, store, since), store)
            + "; run the same command again to evaluate anew")
    except ConnectionError as exc:  # the reference endpoint, checked before anything ran
        print(f"mtrl eval: {exc}", file=sys.stderr, flush=True)
        return 2
    if result is None:
        return 130
    print(_summary(result))
    print(f"mtrl: report: {result.report.markdown} (also .json, .png)")
    if result.tracking_uri and result.tracking_uri.startswith("sqlite:///"):
        from ..tracking import ui_command

        print(f"mtrl: open it with: {ui_command(result.tracking_uri)}")
    return _no_side_empty(result)


def _no_side_empty(result: Any) -> int:
    """1, each such side named with its first error, when a side completed no rollout at all: its figures are
    zeros that measure nothing (an agent that cannot reach the model, an engine that refused every call), and
    a status of 0 would pass them on as a result. The report and the store keep everything that ran."""
    empty = [side for side in result.sides.values()
             if side.rollouts and not any(r.status.value == "completed" for r in side.rollouts)]
    for side in empty:
        first = next((r.error.strip().splitlines()[0] for r in side.rollouts if r.error and r.error.strip()),
                     "none recorded")  # its first line: the rest is the traceback, in the store
        print(f"mtrl eval: no rollout of the {side.label} side completed ({len(side.rollouts)} ended "
              f"{', '.join(sorted({r.status.value for r in side.rollouts}))}); the first error: {first:.600}",
              file=sys.stderr, flush=True)
    return 1 if empty else 0


def _reference(args: argparse.Namespace) -> Any:
    """The ``ReferenceModel`` the --reference-* flags name (None without them); a bad flag exits naming it."""
    from ..coordinator import ReferenceModel

    url, model, key_env = args.reference_url, args.reference_model, args.reference_api_key_env
    if url is None and model is None:
        if key_env is not None:
            raise SystemExit("mtrl eval: --reference-api-key-env needs --reference-url and --reference-model")
        return None
    if url is None or model is None:
        given, missing = ("--reference-url", "--reference-model") if model is None else ("--reference-model",
                                                                                           "--reference-url")
        raise SystemExit(f"mtrl eval: {given} needs {missing} too")
    try:
        reference = ReferenceModel(url=url, model=model, api_key_env=key_env, protocol=args.reference_protocol)
        reference.api_key()  # a named variable that is unset fails now, not after the policy's sides ran
    except ValueError as exc:
        flag = {"reference url": "--reference-url", "reference model": "--reference-model",
                "reference api_key_env": "--reference-api-key-env"}.get(str(exc).split(":")[0], "--reference-*")
        raise SystemExit(f"mtrl eval: {flag}: {exc}") from None
    return reference


def _summary(result: Any) -> str:
    labels = list(result.sides)
    keys = [k for k in next(iter(result.sides.values())).metrics
            if k.startswith(("val/reward/", "val/strict/success", "val/strict/reward_only", "val/completed",
                             "val/truncated", "val/turn_limit"))]
    width = max(len(k) for k in keys)
    lines = [f"{'metric':<{width}}  " + "  ".join(f"{label:>10}" for label in labels)]
    for key in keys:
        values = [result.sides[label].metrics.get(key) for label in labels]
        lines.append(f"{key:<{width}}  " + "  ".join(f"{v:>10.3f}" if v is not None else f"{'-':>10}" for v in values))
    for label, side in result.sides.items():
        if side.strict is not None and side.strict.reward_only:
            ids = ", ".join(d.rollout_id for d in side.strict.reward_only[:5])
            lines.append(f"{label}: {len(side.strict.reward_only)} rollouts succeed by the reward but not strictly "
                         f"(suspected reward hacking), e.g. {ids}")
    return "\n".join(lines)


EVAL = Command("eval", "evaluate a policy (and the base model, a reference model) on a task file", _eval_args, _eval)


# -- mtrl check ---------------------------------------------------------------------------------


def _check_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="check", required=True)
    reward = sub.add_parser("reward", help="check the reward on baseline rollouts")
    _common(reward)
    reward.add_argument("--strict", help="a strict scorer module:function")
    reward.add_argument("--max-tasks", type=int, default=16, help="baseline tasks (default 16)")
    reward.add_argument("--samples", type=int, help="rollouts per task (default: group_size, at most 8)")
    reward.add_argument("--reward-range", nargs=2, type=float, default=[0.0, 1.0], metavar=("LOW", "HIGH"),
                        help="the range the reward is declared to lie in (default 0 1)")
    reward.add_argument("--judge", metavar="JUDGE.yaml",
                        help="audit this group judge (base_url, model, rubric...) on the baseline rollouts instead")
    reward.add_argument("--judge-orders", type=int, default=3, metavar="N",
                        help="with --judge: orders each group is judged in, for position bias (default 3)")
    reward.add_argument("--strict-turns", metavar="MODULE:FUNCTION",
                        help="with a per-turn judge (per_turn: true): fn(rollout, task) -> one strict score per "
                             "assistant turn, the labels the judge is audited against (default: the agent's "
                             "per-turn rewards)")
    env = sub.add_parser("env", help="check determinism and isolation of the environment, list the tools")
    _common(env)
    env.add_argument("--task", action="append", dest="task_ids", help="a task id to use (twice for two tasks)")
    for q in (reward, env):
        q.add_argument("--json", action="store_true", help="print the checklist as JSON")
    check_template.add_args(sub)
    check_budget.add_args(sub)


def _check(args: argparse.Namespace) -> int:
    from ..checks import check_env, check_reward

    if args.check == "template":
        return check_template.run(args)
    if args.check == "budget":
        return check_budget.run(args)
    config = _config(args)
    agent = load_agent(args.agent)
    if args.check == "reward":
        checklist = check_reward(agent, args.dataset, config, strict_scorer=_scorer(args.strict),
                                 max_tasks=args.max_tasks, samples=args.samples,
                                 reward_range=tuple(args.reward_range), split=args.split, output_path=args.output,
                                 judge=args.judge, judge_orders=args.judge_orders,
                                 strict_turns=load_agent(args.strict_turns, "--strict-turns") if args.strict_turns
                                 else None)
    else:
        checklist = check_env(agent, args.dataset, config, task_ids=args.task_ids, split=args.split,
                              output_path=args.output)
    print(json.dumps(checklist.to_dict(), indent=2, default=str) if args.json else checklist)
    return 0 if checklist.ok else 1


CHECK = Command("check", "check a reward, an environment, the chat template or the turn budget before training", _check_args, _check)
