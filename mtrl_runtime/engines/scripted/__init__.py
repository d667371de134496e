"""The ``scripted`` engine: the test double that answers from a script, no model involved (``_engine``)."""

from ._engine import ScriptedEngine, ScriptedFailure, ScriptedReply, ScriptExhausted, create, scripted_logprob

__all__ = ["ScriptExhausted", "ScriptedEngine", "ScriptedFailure", "ScriptedReply", "create", "scripted_logprob"]
