"""Warm start: supervised fine-tuning of the policy on demonstrated or selected trajectories before RL.

- ``Conversation`` and the ``SOURCES`` registry of importers (``openai``
  JSONL, ``mlflow`` traces, ``otel`` spans): demonstrations from outside.
- ``render_conversation`` / ``ConversationRenderer``: a conversation as the
  token ids a live rollout of it records, with the loss mask on the model's
  own tokens (``_render``).
- ``store_demonstrations``: a run's stored rollouts filtered by reward and/or
  strict success, their stored ids as they are (``_store``).
- ``teacher_conversations`` / ``write_conversations``: a frontier
  teacher's successful rollouts (``mtrl collect --teacher-url``) as
  conversations, written as the JSONL ``mtrl sft --conversations`` reads and
  rendered in the student's chat format (``_teacher_data``).
- ``sft``: the fine-tuning itself, on the run's training stack (``_sft``);
  ``mtrl train`` starts from what it writes (``advanced.init_adapter``).

Names load on first use: the renderer and the importers need no torch.
"""

from __future__ import annotations

from ..lazy import lazy_exports
from ._conversation import Conversation, select_by_reward
from ._sources import SOURCES, importer

# public name -> the module that defines it (relative to this package)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("ConversationRenderer", "assistant_weights", "conversation_renderer", "render_conversation"),
                    "._render"),
    **dict.fromkeys(("Demonstration", "conversation_demonstrations"), "._demonstration"),
    **dict.fromkeys(("StoreSelection", "rollout_demonstration", "select_rollouts", "store_demonstrations"), "._store"),
    **dict.fromkeys(("rollout_conversations", "teacher_conversations", "write_conversations"), "._teacher_data"),
    **dict.fromkeys(("ADAPTER_FOLDER", "EpochReport", "SftResult", "SftSettings", "held_out_loss", "sft",
                     "split_held_out"), "._sft"),
}

__all__ = sorted(["Conversation", "SOURCES", "importer", "select_by_reward", *_EXPORTS])

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
