"""``JudgeSpec``: a group judge as data (endpoint, model, rubric, prompt), loadable from a YAML or JSON file.

The same fields are ``advanced.group_judge`` in a run's config and the
content of the file ``mtrl check reward --judge JUDGE.yaml`` reads::

    base_url: http://127.0.0.1:8000/v1   # any OpenAI-compatible endpoint (not the policy's own)
    model: judge-model
    api_key_env: JUDGE_API_KEY           # or api_key: ... (a literal key; prefer the variable)
    rubric_file: rubric.md               # or rubric: "..." (default: DEFAULT_RUBRIC)
    # prompt_template / prompt_file: the user message; {rubric} {task} {trajectories} {ids} {n} are filled in

A file path inside a file is read relative to that file's folder. Unknown
keys and bad values are errors naming the field and the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..datafile import read_data_file
from ..validation import validated

PLACEHOLDERS = ("{rubric}", "{task}", "{trajectories}", "{ids}", "{n}")  # replaced as text, no str.format

DEFAULT_RUBRIC = """\
- A trajectory that reaches the task's goal scores higher than one that does not.
- Among trajectories that reach the goal, a more efficient one (fewer wasted turns or tool calls) scores higher.
- A trajectory that gives a wrong or made-up final answer scores near 0, even if it looks confident.
- Judge what the agent did, not how long or polite its text is."""

DEFAULT_PROMPT_TEMPLATE = """\
You are judging {n} trajectories of an agent attempting the same task, relative to each other.

Rubric:
{rubric}

Task:
{task}

{trajectories}

Give every trajectory a score between 0 and 1 (1 = best), comparing them with each other.
Answer with JSON only, exactly in this shape, one entry per trajectory id ({ids}):
{"scores": [{"id": "<trajectory id>", "explanation": "<one sentence>", "score": <number from 0 to 1>}]}"""


class JudgeSpecError(ValueError):
    """A judge spec (or its file) that cannot be used, naming the field and the value."""


class JudgeSpec(BaseModel):
    """One group judge: which endpoint and model, what it is told (rubric, prompt), how it is called."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1)  # OpenAI-compatible, e.g. http://host:8000/v1 (/chat/completions is added)
    model: str = Field(min_length=1)
    api_key: SecretStr | None = None  # dumped as '**********' (a run's stored config, MLflow params)
    api_key_env: str | None = None  # the environment variable holding the key (read when the judge is built)
    rubric: str = DEFAULT_RUBRIC
    rubric_file: str | None = None
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    prompt_file: str | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(default=2048, ge=16, le=131072)
    timeout_s: float = Field(default=120.0, gt=0.0)
    attempts: int = Field(default=2, ge=1, le=10)  # tries per group on a transport error or a 429/5xx answer
    # true: the judge scores each assistant turn of one rollout (TurnJudge, process rewards for
    # group_based_per_turn), audited by `mtrl check reward --judge`; false: it scores a whole group
    per_turn: bool = False
    max_chars_per_message: int = Field(default=4000, ge=100)  # a longer message is cut (and says so) in the prompt

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url: expected an http(s) URL of an OpenAI-compatible endpoint, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_source_each(self) -> "JudgeSpec":
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("api_key and api_key_env: give one, not both")
        if self.rubric_file is not None and self.rubric != DEFAULT_RUBRIC:
            raise ValueError("rubric and rubric_file: give one, not both")
        if self.prompt_file is not None and self.prompt_template != DEFAULT_PROMPT_TEMPLATE:
            raise ValueError("prompt_template and prompt_file: give one, not both")
        if self.prompt_file is None and "{trajectories}" not in self.prompt_template:
            raise ValueError("prompt_template: must contain {trajectories} (where the group's trajectories go), "
                             f"got {self.prompt_template[:80]!r}")
        return self

    def resolved(self, base: str | Path | None = None) -> "JudgeSpec":
        """This spec with its files read (paths relative to ``base``) and its key taken from the environment."""
        folder = Path(base) if base is not None else Path.cwd()
        update: dict[str, Any] = {}
        if self.rubric_file is not None:
            update["rubric"], update["rubric_file"] = _read(folder, self.rubric_file, "rubric_file"), None
        if self.prompt_file is not None:
            text = _read(folder, self.prompt_file, "prompt_file")
            if "{trajectories}" not in text:
                raise JudgeSpecError(f"prompt_file: {self.prompt_file!r} must contain {{trajectories}} "
                                     "(where the group's trajectories go)")
            update["prompt_template"], update["prompt_file"] = text, None
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise JudgeSpecError(f"api_key_env: the environment variable {self.api_key_env!r} is not set "
                                     "(it should hold the judge endpoint's API key)")
            update["api_key"], update["api_key_env"] = SecretStr(key), None
        return self.model_copy(update=update) if update else self

    @classmethod
    def load(cls, path: str | Path) -> "JudgeSpec":
        """A spec from a YAML (or ``.json``) file, its files read relative to the file's folder."""
        file, data = read_data_file(path, JudgeSpecError, "judge", "judge")
        return cls.of(data, source=str(file)).resolved(file.parent)

    @classmethod
    def of(cls, data: "JudgeSpec | Mapping[str, Any]", source: str = "judge") -> "JudgeSpec":
        """A validated spec from a mapping, or a JudgeSpecError naming the field and the value."""
        if isinstance(data, JudgeSpec):
            return data
        if not isinstance(data, Mapping):
            raise JudgeSpecError(f"{source}: expected a mapping with base_url and model, got {type(data).__name__}")
        return validated(cls, data, error=JudgeSpecError, prefix=f"{source}: ", whole="spec")


def _read(folder: Path, name: str, field: str) -> str:
    path = Path(name) if Path(name).is_absolute() else folder / name
    if not path.is_file():
        raise JudgeSpecError(f"{field}: {name!r} is not a file (looked at {str(path)!r})")
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise JudgeSpecError(f"{field}: {str(path)!r} is empty")
    return text


__all__ = ["DEFAULT_PROMPT_TEMPLATE", "DEFAULT_RUBRIC", "JudgeSpec", "JudgeSpecError", "PLACEHOLDERS"]
