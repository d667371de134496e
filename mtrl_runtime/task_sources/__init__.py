"""Where tasks come from: dataset files and objects users have, mapped to ``types.Task``.

- ``read_tasks(source)`` (``rollouts.load_tasks`` is this): a path, ``PATH``
  or ``PATH::SPLIT`` (``parse_source``), in any format of ``TASK_FORMATS``
  (.jsonl, .json, .csv, .parquet, .arrow, a ``save_to_disk`` folder); a
  ``datasets.Dataset`` / ``DatasetDict`` or a pandas DataFrame in memory; or
  Tasks and row objects.
- ``task_from_row``: one row to a Task, mtrl's row shape or SageMaker AI
  MTRL's (verl's) parquet shape (``_rows``'s docstring has the mapping;
  docs/datasets.md the table).
- ``DatasetError``: every bad row with its index and field, or the source
  that is missing, unreadable, of unknown format or without the split.

pyarrow and ``datasets`` are imported only when a source needs them
(the ``datasets`` extra); importing this package imports neither.
"""

from ._formats import TASK_FORMATS, TaskFormat, format_for, known_formats
from ._load import read_tasks
from ._plain import NotJSON, plain_json
from ._problems import MAX_LISTED, DatasetError, RowProblem
from ._raw import INSTALL_HINT
from ._rows import TASK_FIELDS, convert_row, task_from_row
from ._spec import SOURCE_HELP, SPLIT_SEPARATOR, SourceSpec, parse_source

__all__ = [
    "INSTALL_HINT",
    "MAX_LISTED",
    "SOURCE_HELP",
    "SPLIT_SEPARATOR",
    "TASK_FIELDS",
    "TASK_FORMATS",
    "DatasetError",
    "NotJSON",
    "RowProblem",
    "SourceSpec",
    "TaskFormat",
    "convert_row",
    "format_for",
    "known_formats",
    "parse_source",
    "plain_json",
    "read_tasks",
    "task_from_row",
]
