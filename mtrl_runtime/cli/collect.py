"""``mtrl collect CONFIG --agent module:fn --dataset D [-n N]``: run an agent over N tasks without training.

``--agent`` may also be a deployed AgentCore Runtime's ARN, as for ``mtrl train``.

Each task gets ``core.group_size`` rollouts (``--samples`` overrides),
run concurrently through the same stack and dispatcher training uses, and
stored in the run folder's store. One line is printed per rollout: task,
rollout id, status, turns, tool calls, reward (and the error). With
``--engine scripted --script script.yaml`` the agent's tools are exercised
against scripted replies, no model needed.

A frontier teacher through the same agent: with ``--teacher-url URL
--teacher-model NAME [--teacher-protocol P] [--teacher-api-key-env VAR]``
every call of the rollouts goes to that endpoint instead of the engine (as
``mtrl eval --reference-url`` runs its reference side), and the rollouts the
``--strict`` scorer (and/or ``--min-reward``) passes are written as
conversations to ``--sft-data`` (default ``<run_dir>/teacher_sft.jsonl``):
``mtrl sft CONFIG --conversations FILE`` renders them in the student's chat
format and fine-tunes it; ``mtrl train --init-adapter`` then starts RL.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..task_sources import SOURCE_HELP
from ._agents import AGENT_HELP, agent_env_for, load_strict_scorer
from ._command import Command
from .eval import REFERENCE_PROTOCOLS


def _collect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config (core + advanced)")
    p.add_argument("--agent", help=AGENT_HELP)
    p.add_argument("--dataset", help=f"{SOURCE_HELP} (default: core.dataset)")
    p.add_argument("-n", "--num-tasks", type=int, default=4,
                   help="how many tasks, from the top of the file (default 4)")
    p.add_argument("--split", help="only the tasks whose 'split' is this (e.g. train)")
    p.add_argument("--samples", type=int, help="rollouts per task (default: core.group_size)")
    p.add_argument("--run-dir", help="the run folder whose store records them (overrides core.run_dir)")
    p.add_argument("--engine", help="engine name (overrides core.engine)")
    p.add_argument("--script", help="with the scripted engine: a JSON/YAML script of per-task replies and tool calls")
    teacher = p.add_argument_group("a frontier teacher driving the agent (its successes become mtrl sft data)")
    teacher.add_argument("--teacher-url", metavar="URL",
                         help="the base URL of the teacher's endpoint (OpenAI-compatible: .../v1); every call of "
                              "the rollouts goes there instead of the engine")
    teacher.add_argument("--teacher-model", metavar="NAME", help="the teacher model's name at --teacher-url")
    teacher.add_argument("--teacher-protocol", choices=REFERENCE_PROTOCOLS, default="openai",
                         help="what --teacher-url speaks (default openai: chat completions)")
    teacher.add_argument("--teacher-api-key-env", metavar="VAR",
                         help="the environment variable holding --teacher-url's API key (never written anywhere)")
    teacher.add_argument("--strict", help="with a teacher: keep rollouts a strict scorer module:function passes "
                         "(fn(final_text, ground_truth) >= core.success_threshold)")
    teacher.add_argument("--min-reward", type=float,
                         help="with a teacher: keep rollouts whose reported reward is at least this")
    teacher.add_argument("--sft-data", metavar="PATH",
                         help="with a teacher: where the kept conversations go (default <run_dir>/teacher_sft.jsonl)")


def _collect(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from ..config import MtrlConfig
    from ..rollouts import collect_rollouts, load_tasks, rollout_line

    if args.num_tasks < 1:
        raise SystemExit(f"mtrl collect: -n/--num-tasks must be >= 1, got {args.num_tasks}")
    if args.samples is not None and args.samples < 1:
        raise SystemExit(f"mtrl collect: --samples must be >= 1, got {args.samples}")
    config = MtrlConfig.from_yaml(args.config)
    overrides = {"core.run_dir": args.run_dir, "core.group_size": args.samples, "core.engine": args.engine,
                 "advanced.engine_options.script_file": str(Path(args.script).resolve()) if args.script else None}
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    if args.script and config.core.engine != "scripted":
        raise SystemExit(f"mtrl collect: --script {args.script!r}: only the scripted engine takes a script "
                         f"(the engine is {config.core.engine!r}; add --engine scripted)")
    dataset = args.dataset or config.core.dataset
    if not dataset:
        raise SystemExit(f"mtrl collect: --dataset: give {SOURCE_HELP} (core.dataset is not set)")
    tasks = load_tasks(dataset)
    if args.split is not None:
        tasks = [t for t in tasks if t.split == args.split]
        if not tasks:
            raise SystemExit(f"mtrl collect: --split {args.split!r}: no task of {dataset} has this split")
    tasks = tasks[: args.num_tasks]
    teacher, strict = _teacher(args, config)
    agent = agent_env_for(args.agent, config)
    answered = f"the teacher {teacher.model} at {teacher.url}" if teacher is not None else config.core.engine
    print(f"mtrl: collecting {len(tasks)} tasks x {config.core.group_size} rollouts with {answered} "
          f"into {config.run_folder.store}", flush=True)
    try:
        collected = asyncio.run(collect_rollouts(
            config, agent, tasks, on_rollout=lambda task, r: print(rollout_line(task, r), flush=True),
            reference=teacher, reference_key=teacher.api_key() if teacher is not None else None))
    except ConnectionError as exc:  # the teacher's endpoint, checked before any rollout
        raise SystemExit(f"mtrl collect: --teacher-url: {exc}") from None
    counts = ", ".join(f"{n} {status}" for status, n in collected.counts().items() if n)
    print(f"mtrl: {len(collected.rollouts)} rollouts ({counts}) in {collected.seconds:.1f} s, "
          f"stored in {collected.store_path}")
    if teacher is not None:
        _write_sft_data(args, config, collected.rollouts, tasks, strict)
    return 0


def _teacher(args: argparse.Namespace, config: Any) -> tuple[Any, Any]:
    """(the ``ReferenceModel`` the --teacher-* flags name, the strict scorer); (None, None) without a teacher.
    A bad or lone flag exits naming it."""
    from ..coordinator import ReferenceModel

    url, model = args.teacher_url, args.teacher_model
    selecting = [flag for flag, value in (("--strict", args.strict), ("--min-reward", args.min_reward),
                                          ("--sft-data", args.sft_data),
                                          ("--teacher-api-key-env", args.teacher_api_key_env)) if value is not None]
    if url is None and model is None:
        if selecting:
            raise SystemExit(f"mtrl collect: {selecting[0]} selects a teacher's rollouts; give --teacher-url and "
                             "--teacher-model (to fine-tune on the policy's own, use mtrl sft --from-run)")
        return None, None
    if url is None or model is None:
        given, missing = ("--teacher-url", "--teacher-model") if model is None else ("--teacher-model", "--teacher-url")
        raise SystemExit(f"mtrl collect: {given} needs {missing} too")
    if args.strict is None and args.min_reward is None:
        raise SystemExit("mtrl collect: --teacher-url: give --strict module:function and/or --min-reward X; "
                         "fine-tuning on every teacher rollout would imitate its failures too")
    try:
        teacher = ReferenceModel(url=url, model=model, api_key_env=args.teacher_api_key_env,
                                 protocol=args.teacher_protocol)
        teacher.api_key()  # a named variable that is unset fails now, before any rollout
        strict = load_strict_scorer(args.strict, threshold=config.core.success_threshold) if args.strict else None
    except ValueError as exc:
        flag = {"reference url": "--teacher-url", "reference model": "--teacher-model",
                "reference api_key_env": "--teacher-api-key-env", "--strict": "--strict"}.get(
                    str(exc).split(":")[0], "--teacher-*")
        raise SystemExit(f"mtrl collect: {flag}: {exc}") from None
    return teacher, strict


def _write_sft_data(args: argparse.Namespace, config: Any, rollouts: Any, tasks: Any, strict: Any) -> None:
    """The teacher's kept rollouts as conversations in ``--sft-data``, and the next command."""
    from pathlib import Path

    from ..warmstart import teacher_conversations, write_conversations

    try:
        conversations, selection = teacher_conversations(
            rollouts, {t.id: t for t in tasks}, min_reward=args.min_reward, strict=strict,
            success_threshold=config.core.success_threshold)
    except ValueError as exc:
        raise SystemExit(f"mtrl collect: {exc}") from None
    print(f"mtrl collect: the teacher's rollouts: {selection.summary()}", flush=True)
    if not conversations:
        raise SystemExit("mtrl collect: no teacher rollout passes the filters; nothing written (collect more tasks, "
                         "or check the teacher with mtrl eval --reference-url)")
    path = write_conversations(Path(args.sft_data) if args.sft_data else config.run_dir / "teacher_sft.jsonl",
                               conversations)
    print(f"mtrl collect: {len(conversations)} conversations of {len(selection.kept)} rollouts written to {path}; "
          f"fine-tune on them: mtrl sft {args.config} --conversations {path} --out DIR", flush=True)


COLLECT = Command("collect", "run an agent over a few tasks without training and print each rollout",
                  _collect_args, _collect)
