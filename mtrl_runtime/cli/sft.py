"""``mtrl sft CONFIG --out DIR (--from-run RUN | --conversations FILE)``: warm-start the policy before RL.

Supervised fine-tuning of ``core.model`` (LoRA, or every weight under
``advanced.full_finetune``) on demonstrations, with the loss on the model's
own turns only:

- ``--from-run RUN [--min-reward X] [--strict module:fn] [--split S]``: the
  rollouts a run recorded (``mtrl collect``, ``mtrl train``) that pass the
  filters: rejection-sampling fine-tuning on their stored token ids.
- ``--conversations FILE --source openai|mlflow|otel [--min-reward X]``:
  demonstrations from outside, rendered with the chat format the policy is
  served with; an mtrl run's traces carry their rollouts' rewards and need
  ``--min-reward`` (the others record none).

It prints the train and held-out loss per epoch and writes ``DIR/adapter``
(and ``DIR/sft.json``); ``mtrl train CONFIG --init-adapter DIR/adapter``
starts RL from it.
"""

from __future__ import annotations

import argparse

from ._agents import load_agent, load_strict_scorer
from ._command import Command


def _sft_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config (core + advanced): the model, LoRA settings, precision")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-run", metavar="RUN_DIR", help="a run folder whose stored rollouts to select from")
    source.add_argument("--conversations", metavar="PATH", help="demonstrated conversations (see --source)")
    p.add_argument("--source", default="openai",
                   help="what --conversations holds: openai (conversation JSONL, the default), mlflow, otel")
    p.add_argument("--min-reward", type=float,
                   help="keep rollouts (--from-run, or an mtrl run's traces) whose recorded reward is at least this")
    p.add_argument("--strict", help="--from-run: keep rollouts a strict scorer module:function passes "
                   "(fn(final_text, ground_truth) >= core.success_threshold)")
    p.add_argument("--split", help="--from-run: only rollouts of tasks whose 'split' is this (e.g. train)")
    p.add_argument("--out", required=True, help="the folder to write adapter/ and sft.json into")
    p.add_argument("--epochs", type=int, default=3, help="passes over the demonstrations (default 3)")
    p.add_argument("--lr", type=float, help="learning rate (default: core.learning_rate)")
    p.add_argument("--held-out", type=float, default=0.1,
                   help="share of demonstrations (whole tasks) held out to measure the loss on (default 0.1)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step (default 8)")
    p.add_argument("--seed", type=int, help="split and shuffle seed (default: core.seed)")


def _sft(args: argparse.Namespace) -> int:
    from ..config import MtrlConfig
    from ..engines import load_tokenizer, resolve_model
    from ..warmstart import (SftSettings, conversation_demonstrations, conversation_renderer, importer,
                             select_by_reward, sft, store_demonstrations)
    from ._precision import resolve_precision

    if args.conversations and (args.strict or args.split):
        raise SystemExit("mtrl sft: --strict and --split select stored rollouts; use them with --from-run")
    config, precision = resolve_precision(MtrlConfig.from_yaml(args.config))
    print(f"mtrl: {precision}", flush=True)
    settings = SftSettings(epochs=args.epochs, learning_rate=args.lr, held_out=args.held_out,
                           batch_size=args.batch_size, seed=config.core.seed if args.seed is None else args.seed)
    tokenizer = load_tokenizer(resolve_model(config.core.model))
    renderer = conversation_renderer(tokenizer, config.advanced.chat_format, config.advanced.history_training)
    try:  # bad input (a source, a line, a filter) is named by the error itself: no traceback
        if args.from_run:
            strict = None
            if args.strict:
                strict = load_strict_scorer(args.strict, threshold=config.core.success_threshold)
            demos, selection = store_demonstrations(args.from_run, renderer, min_reward=args.min_reward, strict=strict,
                                                    success_threshold=config.core.success_threshold, split=args.split)
            print(f"mtrl sft: {args.from_run}: {selection.summary()}", flush=True)
            if not demos:
                raise ValueError(f"no rollout of {args.from_run} passes the filters ({selection.summary()}); "
                                 "collect more, or lower --min-reward")
        else:
            conversations, below = select_by_reward(importer(args.source)(args.conversations), args.min_reward)
            if not conversations:
                raise ValueError(f"no conversation of {args.conversations} has a reward of at least "
                                 f"{args.min_reward:g} ({below} below it); collect more, or lower --min-reward")
            demos = conversation_demonstrations(renderer, conversations)
            kept = f"; {below} with reward below {args.min_reward:g} left out" if args.min_reward is not None else ""
            print(f"mtrl sft: {args.conversations}: {len(demos)} conversations ({args.source}){kept}", flush=True)
    except ValueError as err:
        raise SystemExit(f"mtrl sft: {err}") from None
    result = sft(config, demos, args.out, settings, echo=lambda line: print(line, flush=True))
    print(f"mtrl: adapter: {result.adapter}; start RL from it: mtrl train {args.config} --agent ... "
          f"--init-adapter {result.adapter}")
    return 0


SFT = Command("sft", "warm-start the policy: fine-tune it on stored rollouts or demonstrated conversations",
              _sft_args, _sft)
