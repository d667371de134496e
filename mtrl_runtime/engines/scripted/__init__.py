"""The ``scripted`` engine: the test double that answers from a script, no model involved (``_engine``).

Scripts are lists of replies or callables in code, or JSON/YAML files
(``_script_file``: per-task replies and tool calls); ``create`` is the
registry's factory (``_factory``).
"""

from ._engine import ScriptedEngine, ScriptedFailure, ScriptedReply, ScriptExhausted, scripted_logprob
from ._factory import create
from ._script_file import FileScript, ScriptFileError, load_script_file, parse_script

__all__ = [
    "FileScript",
    "ScriptExhausted",
    "ScriptFileError",
    "ScriptedEngine",
    "ScriptedFailure",
    "ScriptedReply",
    "create",
    "load_script_file",
    "parse_script",
    "scripted_logprob",
]
