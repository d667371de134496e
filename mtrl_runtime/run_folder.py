"""Where a run's files live: one value names them all.

A run folder (``core.run_dir``, ``output_path``) holds what training,
collection and evaluation leave behind::

    runs/x/
      trajectories.db      the trajectory store (sqlite backend)
      adapter/             the final adapter (or model) the trainer saves
      adapters/v<N>/       policy versions pushed to an engine in another process
      checkpoints/step-N/  the trainer's checkpoints
      mlflow.db            the embedded MLflow tracking store ...
      mlartifacts/         ... and its artifacts
      diagnostics.jsonl    the diagnostics monitor's findings
      tripwires.jsonl      the evidence of every tripped rollout (advanced.tripwires)
      eval/                an evaluation's own run folder (its store and report)
      checks/              mtrl check reports

    folder = RunFolder("runs/x")
    folder.store         # Path("runs/x/trajectories.db")
    folder.mlflow_uri    # "sqlite:////abs/runs/x/mlflow.db"

Every place that names one of these files asks this value, so a name is
spelled once. Imports nothing of the project.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STORE_FILE = "trajectories.db"
ADAPTER_FOLDER = "adapter"
PUSHED_ADAPTERS_FOLDER = "adapters"
CHECKPOINTS_FOLDER = "checkpoints"
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS_FOLDER = "mlartifacts"
DIAGNOSTICS_FILE = "diagnostics.jsonl"
TRIPWIRES_FILE = "tripwires.jsonl"
EVALUATION_FOLDER = "eval"
CHECKS_FOLDER = "checks"
ONLINE_FOLDER = "online"  # mtrl online: candidate and promoted adapters, the gates' store
LORA_ADAPTER_CONFIG = "adapter_config.json"  # what marks a saved peft adapter folder


class _Below:
    """A path below the run folder's root, read as an attribute (``folder.store``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, folder: "RunFolder", owner: type | None = None) -> Path:
        return folder.root / self.name


@dataclass(frozen=True)
class RunFolder:
    """The paths of one run's files, below ``root`` (see the module docstring)."""

    root: Path

    store = _Below(STORE_FILE)  # the trajectory store's file (the sqlite backend's; memory writes nothing there)
    adapter = _Below(ADAPTER_FOLDER)  # the final adapter (or full model) the trainer saves
    pushed_adapters = _Below(PUSHED_ADAPTERS_FOLDER)  # versions saved for an engine that loads them from disk
    checkpoints = _Below(CHECKPOINTS_FOLDER)  # checkpoints/step-<N>
    mlflow_db = _Below(MLFLOW_DB)  # the embedded MLflow tracking store ...
    mlflow_artifacts = _Below(MLFLOW_ARTIFACTS_FOLDER)  # ... and its artifacts
    diagnostics = _Below(DIAGNOSTICS_FILE)
    tripwires = _Below(TRIPWIRES_FILE)  # each tripped rollout's evidence (tripwires.TripwireWatch)
    evaluation = _Below(EVALUATION_FOLDER)  # an evaluation's default output, itself a run folder
    checks = _Below(CHECKS_FOLDER)
    online = _Below(ONLINE_FOLDER)  # mtrl online: adapters/v<N>, gates.db

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))  # a str is taken too

    @property
    def mlflow_uri(self) -> str:
        """The embedded MLflow tracking store of this run as a URI (absolute)."""
        return f"sqlite:///{self.root.resolve() / MLFLOW_DB}"

    def saved_adapter(self) -> Path | None:
        """The final LoRA adapter when the trainer saved one here (it holds ``adapter_config.json``), else None."""
        return self.adapter if (self.adapter / LORA_ADAPTER_CONFIG).is_file() else None


__all__ = [
    "ADAPTER_FOLDER",
    "CHECKPOINTS_FOLDER",
    "CHECKS_FOLDER",
    "DIAGNOSTICS_FILE",
    "TRIPWIRES_FILE",
    "EVALUATION_FOLDER",
    "LORA_ADAPTER_CONFIG",
    "MLFLOW_ARTIFACTS_FOLDER",
    "MLFLOW_DB",
    "PUSHED_ADAPTERS_FOLDER",
    "STORE_FILE",
    "RunFolder",
]
