"""One config tree for every part of Cooper.

Precedence, lowest first: field defaults < YAML file < environment (`COOPER_<SECTION>__<FIELD>`, for deployment)
< dotted command-line overrides (`reward.http.port=8001`). Every model forbids unknown keys, so a typo fails at
once with the dotted path of the key. This module must import without torch (a test checks): the CLI validates
the config before it loads anything heavy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

ENV_PREFIX = "COOPER_"
ENV_NESTING = "__"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and what to do."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class ServerConfig(StrictModel):
    """How one gRPC service listens, and how clients reach it."""

    host: str = "127.0.0.1"
    """Interface the gRPC server binds (0.0.0.0 in containers)."""
    port: int = Field(default=0, ge=0, le=65535)
    """gRPC port; 0 picks a free port (local runs)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Prometheus metrics HTTP port; None serves no metrics endpoint, 0 picks a free port."""
    max_message_mb: int = Field(default=64, ge=1, le=2047)
    """Largest gRPC message accepted or sent, in MiB."""
    grace_s: float = Field(default=10.0, ge=0)
    """On SIGTERM, how long in-flight calls may take to finish before they are cancelled."""
    address: str | None = None
    """host:port where clients reach the service; None means the orchestrator starts it locally."""
    deadline_s: float = Field(default=600.0, gt=0)
    """Clients' deadline for one call to this service."""
    unavailable_timeout_s: float = Field(default=300.0, ge=0)
    """How long a client keeps retrying a call that fails with UNAVAILABLE (the service is starting, restarting
    or moved; the only status retried) before it gives up with ServiceUnavailable. Long enough for a restarted
    service to reload a GPU model; 0 tries once."""
    retry_backoff_s: float = Field(default=0.2, gt=0)
    """First retry delay; doubled after each retry, up to retry_backoff_max_s."""
    retry_backoff_max_s: float = Field(default=5.0, gt=0)
    """Longest delay between two retries (and between two reconnection attempts of the channel), so a service
    that comes back is found within seconds."""
    health_port: int | None = Field(default=None, ge=0, le=65535)
    """A second, plaintext port that serves only the health service, for probes that cannot speak TLS (Kubernetes'
    native `grpc:` probes); None serves health on the main port only. Open to anyone who reaches it, and all it
    tells is SERVING or not."""


# Per-service defaults live in subclasses (not in default factories) so that overriding one key of a section,
# say `verifier.server.host`, keeps the section's other defaults.
class VerifierServerConfig(ServerConfig):
    port: int = Field(default=50051, ge=0, le=65535)
    """gRPC port of the verifier; 0 picks a free port."""
    metrics_port: int | None = Field(default=9101, ge=0, le=65535)
    """Prometheus metrics port; None for none, 0 picks a free port."""


class RewardServerConfig(ServerConfig):
    port: int = Field(default=50052, ge=0, le=65535)
    """gRPC port of the reward service; 0 picks a free port."""
    metrics_port: int | None = Field(default=9102, ge=0, le=65535)
    """Prometheus metrics port; None for none, 0 picks a free port."""


class PolicyServerConfig(ServerConfig):
    port: int = Field(default=50053, ge=0, le=65535)
    """gRPC port of the policy service; 0 picks a free port."""
    metrics_port: int | None = Field(default=9103, ge=0, le=65535)
    """Prometheus metrics port; None for none, 0 picks a free port."""


class GeneratorServerConfig(ServerConfig):
    port: int = Field(default=50054, ge=0, le=65535)
    """gRPC port of the generator service; 0 picks a free port."""
    metrics_port: int | None = Field(default=9104, ge=0, le=65535)
    """Prometheus metrics port; None for none, 0 picks a free port."""


class VerifierConfig(StrictModel):
    """The rule verifier (math-verify in worker processes)."""

    server: VerifierServerConfig = Field(default_factory=VerifierServerConfig)
    """gRPC server of the verifier."""
    workers: int | None = Field(default=None, ge=1)
    """Worker processes; None uses the CPU count."""
    timeout_s: int = Field(default=3, ge=1)
    """Hard per-item time limit in whole seconds (math-verify's timeouts misbehave with fractions)."""
    chunk_size: int = Field(default=16, ge=1)
    """Most items sent to a worker at once; a batch is cut into chunks so that all workers share it."""
    max_chars: int = Field(default=20000, ge=100)
    """Longer completions and references are cut to their last max_chars characters, where the answer is."""
    answer: Literal["anywhere", "boxed"] = "anywhere"
    """Where the completion's answer is read. anywhere: math-verify's default, the last LaTeX or plain expression
    anywhere in the text. boxed: only the last complete \\boxed{...}; a completion without one is NO_ANSWER. Use
    boxed when prompts ask for a boxed answer and a question contains an expression equal to its answer: there,
    anywhere accepts a completion that just repeats the question's expression."""


class HttpConfig(StrictModel):
    """The reward service's HTTP API."""

    host: str = "127.0.0.1"
    """Interface the HTTP server binds."""
    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port; 0 picks a free port; None-like disabling is done with `enabled`."""
    enabled: bool = True
    """Serve the HTTP API next to gRPC."""
    token: SecretStr | None = None
    """Bearer token required on /v1/* and /get_reward; None leaves the API open."""
    max_items: int = Field(default=512, ge=1)
    """Most items in one request (413 beyond)."""
    max_chars: int = Field(default=32000, ge=1)
    """Longest question, reference or completion in characters (413 beyond)."""
    max_body_mb: float = Field(default=64.0, gt=0)
    """Largest request body in MiB, checked on Content-Length before the body is read (413 beyond)."""

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


class BatchingConfig(StrictModel):
    """Dynamic batching of scoring requests from gRPC and HTTP."""

    max_batch_size: int | None = Field(default=None, ge=1)
    """Most sequences in one forward pass; None: chosen at start-up by a short calibration of the model, the
    smallest batch within 0.9 of its best items/s (serving_defaults.py; logged with the measurements). Set it
    where scores must be the same bit for bit across restarts (the training presets do): a request cut into
    passes of another size rounds differently, by about 1e-7."""
    max_tokens: int = Field(default=32768, ge=1)
    """Most padded tokens (batch size x longest sequence) in one forward pass."""
    max_wait_ms: float | None = Field(default=None, ge=0)
    """How long the first waiting request may wait for others to fill a batch; None: a quarter of one forward pass
    of the chosen batch, from the same calibration."""
    spread: bool | None = None
    """Cut each batch no larger than the items waiting and in flight shared over the batch slots (model_copies x
    max_inflight), so that a few concurrent requests keep every model copy busy instead of filling one copy's batch
    (and waiting max_wait_ms for more) while the others idle; a lone request goes to the model at once. None: on
    where max_batch_size is chosen at start-up, off where it is set (then passes are cut alike whatever the load, for
    scores the same bit for bit)."""
    max_inflight: int = Field(default=2, ge=1)
    """Batches handed to each model copy (reward.model_copies) and not yet answered: 2 keeps the next batch waiting
    at the model while one runs, so the model never idles through a round trip to the batching loop; more hide a
    slower hand-off (a busy serving process) at the cost of cutting batches earlier."""
    max_queue: int = Field(default=4096, ge=1)
    """Most items waiting; beyond it requests are refused (HTTP 503 with Retry-After, gRPC RESOURCE_EXHAUSTED)."""
    queue_timeout_s: float = Field(default=30.0, gt=0)
    """An item waiting longer than this is failed instead of scored late."""


class OptimConfig(StrictModel):
    """AdamW with linear warm-up, then constant."""

    lr: float = Field(default=1e-5, gt=0)
    """Learning rate."""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Clip the total gradient norm to this value."""
    warmup_steps: int = Field(default=0, ge=0)
    """Updates over which the learning rate rises linearly from 0."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward; gradients accumulate over micro-batches."""


class PolicyOptimConfig(OptimConfig):
    """The policy's AdamW: the paper's lr 1e-6 with 20 warm-up steps (a subclass, so overriding one key keeps these)."""

    lr: float = Field(default=1e-6, gt=0)
    """Learning rate."""
    warmup_steps: int = Field(default=20, ge=0)
    """Updates over which the learning rate rises linearly from 0."""


class ReplicaConfig(StrictModel):
    """A read replica (reward.role=replica): how it follows the trainer's checkpoints and when it counts as stale."""

    poll_s: float = Field(default=2.0, gt=0)
    """How often the replica lists reward.checkpoint_dir (the trainer's, on the shared volume) for a newer complete
    checkpoint. A new version is served at most about poll_s plus its load time after the trainer saved it."""
    max_lag_s: float | None = Field(default=120.0, gt=0)
    """Stale when a newer checkpoint has been on the volume this long without being loaded (measured from when
    this replica first saw it), or when the directory could not be read for this long; None: no time limit."""
    max_versions_behind: int | None = Field(default=None, ge=1)
    """Stale when the newest checkpoint on the volume is more than this many versions ahead of the served one;
    None: no version limit. Either limit makes the replica stale."""
    on_stale: Literal["serve", "refuse"] = "serve"
    """Past a limit: "serve" keeps answering, with the header X-Cooper-Stale (and gRPC trailing metadata
    cooper-stale) and the metric cooper_reward_replica_stale=1; "refuse" answers scoring with HTTP 503 +
    Retry-After (gRPC UNAVAILABLE) and reports unready (/readyz and the gRPC health service), so that a load
    balancer sends its traffic to replicas that are current."""


class TrainerDurability(StrictModel):
    """What a training service (policy, reward) keeps on disk so that a restart loses nothing: the same settings and
    the same mechanism (cooper/runtime/durability.py) for both; docs/operations.md, "When things die"."""

    save_every: int = Field(default=10, ge=0)
    """Write a full checkpoint (weights, optimizer state, the service's bookkeeping) every N updates; 0 only on
    Save() and on stop. With the journal a restart loses no update whatever N is: N only bounds how many updates a
    restart applies again (at most N - 1) and how long the journal grows. With save_in_background the training path
    pays only for an in-memory copy (bench/checkpoint.py)."""
    save_in_background: bool = True
    """Write the periodic checkpoints on a thread of their own from an in-memory copy of the state, taken on the
    training path, so the next updates run while it is written (at most one in flight: a save waits for the one
    before). The copy costs host memory the size of the checkpoint (float32 weights and two AdamW moments). False
    writes on the training path. Save() and the stop save always write before they answer."""
    journal: bool = True
    """Append every applied update (what applying it again needs: the policy's rollout and rewards, VerifyRM's
    preference pairs; and the result answered) to a write-ahead journal in checkpoint_dir/journal, fsynced before the
    service answers; a restarted service loads its newest checkpoint and applies the journaled updates after it
    again, in order, so it comes back at the update it last answered and none is lost or applied twice (on one CPU
    kind the state is bit-identical to an uninterrupted run's). Entries are deleted once a checkpoint that includes
    them is on disk, so it needs save_every >= 1."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """Newest checkpoints kept in checkpoint_dir; older ones are deleted after each save (the newest, which a resume
    needs, never is)."""
    save_on_stop: bool = True
    """On a graceful stop (SIGTERM: `docker compose down` or `restart`, a pod rolled), write a checkpoint if updates
    were applied since the last one, so that a restart applies nothing again."""

    @model_validator(mode="after")
    def _journal_needs_periodic_checkpoints(self) -> TrainerDurability:
        if self.journal and self.save_every == 0:
            service = "policy" if isinstance(self, PolicyConfig) else "reward"
            raise ValueError(
                f"{service}.journal with {service}.save_every 0: the journal is emptied only when a checkpoint is "
                f"written, so without periodic checkpoints it would grow for the whole run; set {service}.save_every "
                f"(e.g. 10) or {service}.journal=false"
            )
        return self


class LearnOnlineConfig(StrictModel):
    """The reward service learning from what it scores (reward.learn_online): every completion scored over HTTP is
    checked by the rule verifier against its reference; at each learning step, per question, the first verified-right
    completion is the positive against each verified-wrong one (Cooper's pair rule, run.negatives=rollouts), and
    VerifyRM takes one Bradley-Terry update over those pairs: a new version, journaled and checkpointed as in a
    Cooper run. Every score still names the version that produced it; the scoring API is unchanged."""

    enabled: bool = False
    """Off: the service scores and never learns by itself (Cooper's own loop sends its updates over gRPC)."""
    every_requests: int = Field(default=0, ge=0)
    """Take a learning step after this many scoring requests; 0: only when asked (POST /v1/learn, which a trainer
    sends at its step boundary: cooper.integrations.trl does after each batch)."""
    max_buffered: int = Field(default=65536, ge=1)
    """Scored completions kept for the next learning step; beyond it the oldest are dropped (and counted)."""
    verifier: VerifierConfig = Field(default_factory=lambda: VerifierConfig(workers=1))
    """The rule verifier's checks, in worker processes of the reward service (its `server` is not used)."""


class RewardConfig(TrainerDurability):
    """VerifyRM: scoring, online Bradley-Terry updates, versions."""

    role: Literal["trainer", "replica"] = "trainer"
    """"trainer": the one instance that applies updates and writes checkpoints. "replica": serving only, any
    number of them: loads each new checkpoint the trainer writes to reward.checkpoint_dir (reward.replica), refuses
    Update and Save (gRPC FAILED_PRECONDITION) and never writes to that directory, so it may be mounted read-only
    (reward.save_every, save_on_stop and keep_checkpoints are the trainer's and are ignored here)."""
    replica: ReplicaConfig = Field(default_factory=ReplicaConfig)
    """How a replica follows the trainer; ignored by the trainer."""
    server: RewardServerConfig = Field(default_factory=RewardServerConfig)
    """gRPC server of the reward service."""
    http: HttpConfig = Field(default_factory=HttpConfig)
    """HTTP API served by the same process."""
    model: str = "tiny"
    """Hub id or local directory of a one-output sequence-classification model; "tiny" builds one locally."""
    torch_threads: int | None = Field(default=None, ge=1)
    """CPU threads torch may use in the reward service; None keeps torch's default (all cores). On a small shared
    CPU, 1 is several times faster for tiny models (two threads per forward pass oversubscribe the cores)."""
    device: str = "auto"
    """"auto" (cuda if present), "cpu" or "cuda:N"."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype; auto = float32 on CPU, bfloat16 on GPU. bfloat16 runs forward passes under autocast while the
    trained weights and AdamW state stay float32 (a 1e-5 step vanishes when added to a bf16 weight); a replica,
    which never trains, holds bf16 weights."""
    max_length: int = Field(default=2048, ge=16)
    """Longest input in tokens; longer inputs are truncated from the left of the completion by the template."""
    cpu_linear: Literal["auto", "torch", "onednn"] = "auto"
    """How a float32 model on a CPU runs its linear layers when scoring: "torch" (MKL on x86 builds), "onednn", or
    "auto": time a pass each way at start-up and take oneDNN only when it is clearly faster. On AMD CPUs MKL takes
    a path without AVX-512 and oneDNN does not: the service served SmolLM2-135M 1.58x as fast with it on a Zen 5
    (docs/benchmarks.md); the tiny models, whose layers are too small to gain, keep torch's. Training passes always
    run torch's (verify_rm.py)."""
    discrete: bool = False
    """Reward = 1[sigmoid(logit) > 0.5] instead of sigmoid(logit)."""
    model_process: bool = True
    """Run VerifyRM (forward passes, updates, checkpoints) in a child process of its own, so that the HTTP and gRPC
    servers (which also tokenize requests) never compete with it for the GIL; False runs it on a thread of the
    serving process."""
    tokenize_in_model: bool = False
    """Tokenize in the model's process, one batched tokenizer call per scoring batch, instead of in the serving
    process, a call per request as it arrives: the serving process then only parses, batches and answers (the texts
    cross to the model process instead of their token ids). With model_copies, each copy tokenizes its own batches."""
    model_copies: int | None = Field(default=None, ge=1)
    """With model_process: this many model processes, each a whole copy of VerifyRM; None: chosen from the machine
    at start-up, on a CPU one per physical core its torch_threads leave room for, on a GPU one (serving_defaults.py). Scores go to the least busy
    copy; every update, checkpoint load and replica swap goes to all of them, in the same order, so they stay the same
    model (each trains on the same pairs: the update's compute is repeated; the first copy alone writes checkpoints).
    The copies' results are compared after every update, and a difference stops the service (a restart reloads them
    all from one checkpoint). For a CPU serving more score requests than one process can forward (two copies on
    two cores: docs/benchmarks.md); on a GPU, whose kernels need not be bit-reproducible, use read replicas."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer of the Bradley-Terry updates (paper: lr 1e-5, wd 0.01, clip 1.0)."""
    update_steps: int = Field(default=1, ge=1)
    """AdamW steps per Update (one version), each over the update's pairs and its replay. The paper takes one."""
    replay_updates: int = Field(default=0, ge=0)
    """A variant beside the paper's recipe (0): each Update also trains on the pairs of this many previous Updates,
    so that VerifyRM keeps pace with a policy that moves faster than one small batch of pairs can teach, and does
    not forget last step's lesson while learning this one's. The replay is part of the checkpoint."""
    replay_sample: int = Field(default=0, ge=0)
    """With replay_updates: replayed pairs drawn (without replacement) for each optimizer step; 0 takes the whole
    replay every step. Sampling keeps an update's cost flat as the replay fills (about replay_updates times the
    fresh pairs), while every replayed pair is still seen several times before it leaves the replay."""
    calibration_weight: float = Field(default=0.0, ge=0)
    """A variant beside the paper's recipe (0): adds this weight times the BCE of every pair's positive against 1
    and its negative against 0 (the verifier's labels, as in VerifyRM's pretraining) to the Bradley-Terry loss.
    Bradley-Terry constrains only differences of logits, so all scores may drift up together while the ranking
    stays right; the discrete reward 1[p > 0.5] reads absolute scores, and a drift upward passes wrong answers."""
    optimizer_restart_every: int = Field(default=0, ge=0)
    """A variant beside the paper's recipe (0: never): every this many Updates, AdamW's moment estimates are reset
    before the Update (warm restarts). The tiny VerifyRM learned the reference comparison in pretraining only with
    AdamW restarted every epoch; with one AdamW throughout it stayed on a plateau (docs/experiments.md)."""
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    """Dynamic batching."""
    learn_online: LearnOnlineConfig = Field(default_factory=LearnOnlineConfig)
    """The service learning from the completions it scores, for trainers other than Cooper's own loop (TRL, verl);
    off by default. docs/reward-api.md, "Use Cooper's reward model from TRL or verl"."""
    checkpoint_dir: str = "checkpoints/reward"
    """Where checkpoints and the update journal go; start-up resumes from them."""

    @model_validator(mode="after")
    def _replicas_do_not_learn(self) -> RewardConfig:
        if self.learn_online.enabled and self.role == "replica":
            raise ValueError("reward.learn_online.enabled needs reward.role=trainer: a read replica never changes the "
                             "model; enable learning on the trainer and send its scoring there")
        return self

    @model_validator(mode="after")
    def _copies_are_processes(self) -> RewardConfig:
        if self.model_copies is not None and self.model_copies > 1 and not self.model_process:
            raise ValueError(f"reward.model_copies={self.model_copies} needs reward.model_process=true: the copies "
                             "are model processes")
        return self


class GRPOConfig(StrictModel):
    """The GRPO loss (docs/design.md section 2.1); defaults are the paper's."""

    clip_low: float = Field(default=0.2, ge=0)
    """Lower PPO ratio clip: ratio >= 1 - clip_low."""
    clip_high: float = Field(default=0.2, ge=0)
    """Upper PPO ratio clip: ratio <= 1 + clip_high."""
    dual_clip: float = Field(default=3.0, gt=1)
    """Dual clip c for negative advantages: the loss is at most -c * A."""
    kl_coef: float = Field(default=0.001, ge=0)
    """Weight of the k3 KL to the frozen reference; 0 adds no KL term (the reference is then loaded only for
    `track_kl`)."""
    track_kl: bool = True
    """Measure KL(policy || initial policy) every step even when kl_coef is 0 (metrics `kl` and `kl_seq`): what
    reward over-optimisation is plotted against. Costs one forward pass of the frozen reference per update."""
    logratio_clamp: float = Field(default=20.0, gt=0)
    """Log-ratios are clamped to [-x, x] before exp."""
    kl_clamp: float = Field(default=10.0, gt=0)
    """The k3 value is clamped to [-x, x]."""
    adv_eps: float = Field(default=1e-6, gt=0)
    """Added to the group std in the advantage."""
    epochs: int = Field(default=1, ge=1)
    """PPO epochs over each rollout."""
    rollout_is_cap: float | None = Field(default=None, gt=0)
    """Truncated importance sampling against the rollout engine's mismatch (off: None, the paper's GRPO). The
    engine that sampled (vLLM, bf16 kernels) is not exactly the trainer's pi_old, so the rollout is slightly
    off-policy; with a cap C each token's policy loss is weighted by min(pi_old / pi_rollout, C), from the log-probs
    Generate returned. The mismatch itself is logged every update either way (metrics rollout/*). verl: 2.0."""


VLLM_MAX_TEMPERATURE = 2.0
"""The highest temperature vLLM's SamplingParams accepts (0.32: "temperature must be in [0, 2]")."""


def vllm_sampling_problem(temperature: float, n: int, key: str) -> str | None:
    """Why vLLM would refuse to sample `n` completions at `temperature` (None: it accepts them). Checked where the
    config is read, so a run fails at once with the key to change instead of at its first rollout."""
    if temperature > VLLM_MAX_TEMPERATURE:
        return f"{key} is {temperature}, above the {VLLM_MAX_TEMPERATURE} that vLLM accepts"
    if temperature == 0 and n > 1:
        return (f"{key} is 0 (greedy) with {n} samples per prompt: vLLM samples only one greedy completion; set a "
                "temperature above 0")
    return None


class SamplingConfig(StrictModel):
    """Rollout sampling."""

    n: int = Field(default=16, ge=2)
    """Completions per prompt (the group size G); at least 2, since a group of one has no relative signal."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature; the trainer divides logits by it too, so the loss sees the distribution that was
    sampled from (0 = greedy; the trainer then uses 1)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling."""
    max_new_tokens: int = Field(default=1024, ge=1)
    """Most generated tokens per completion."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings."""


class PolicyDistributedConfig(StrictModel):
    """How the policy's ranks train together when `policy.world_size` is above 1 (FSDP2, one process per rank)."""

    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; auto = nccl on CUDA, gloo on the CPU."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Longest a collective waits for the other ranks before the update fails. A rank that dies is noticed at once
    (its process exits); this bounds a rank that hangs."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the gradient reduce-scatter when forward passes run in bfloat16 (policy.dtype on CUDA). float32
    keeps the sum over ranks as exact as one rank's; bfloat16 halves the traffic."""


class PolicyConfig(TrainerDurability):
    """The policy: rollout engine and GRPO trainer."""

    server: PolicyServerConfig = Field(default_factory=PolicyServerConfig)
    """gRPC server of the policy service."""
    model: str = "tiny"
    """Hub id or local directory of a causal LM; "tiny" builds one locally."""
    engine: Literal["transformers", "vllm"] = "transformers"
    """Rollout engine; vllm needs a GPU and the `gpu` extra."""
    device: str = "auto"
    """"auto" (cuda if present), "cpu" or "cuda:N"."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype; auto = float32 on CPU, bfloat16 on GPU. bfloat16 runs forward passes under autocast while
    the trained weights and AdamW state stay float32 (a 1e-6 step vanishes when added to a bf16 weight)."""
    generate_batch_size: int = Field(default=64, ge=1)
    """Most sequences in one transformers `generate` call; a request is cut into chunks of this size."""
    torch_threads: int | None = Field(default=None, ge=1)
    """CPU threads torch may use in the service process; None keeps torch's default (all cores). Tiny models run
    fastest, and steadiest on a busy machine, with 1."""
    rollout_threads: int | None = Field(default=None, ge=1)
    """CPU threads of the rollout process, which samples beside the trainer when run.max_staleness > 0 with the
    transformers engine; None: torch_threads. On 2 cores with torch_threads 1, each of the two gets a core."""
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, lt=1)
    """Share of GPU memory vLLM may take (weights and KV cache); the trainer shares the GPU with it."""
    vllm_max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + completion vLLM plans its KV cache for; None uses the model's maximum."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling."""
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    """GRPO loss."""
    optim: PolicyOptimConfig = Field(default_factory=lambda: PolicyOptimConfig())
    """Optimizer (paper: lr 1e-6, 20 warm-up steps, wd 0.01, clip 1.0)."""
    checkpoint_dir: str = "checkpoints/policy"
    """Where checkpoints and the update journal go; start-up resumes from them."""
    world_size: int | Literal["auto"] = 1
    """Training ranks. 1 trains in the service process. N > 1 starts N-1 more processes beside it and trains with
    FSDP2 across all N: each rank holds a shard of the weights and optimizer and runs forward/backward on its share
    of the batch; generation stays on rank 0. On CUDA rank r uses cuda:r (pick the GPUs with CUDA_VISIBLE_DEVICES);
    "auto" = one rank per visible GPU (1 without CUDA). One node only (docs/operations.md, "Several GPUs")."""
    distributed: PolicyDistributedConfig = Field(default_factory=PolicyDistributedConfig)
    """Process group and mixed precision of the ranks (used when world_size > 1)."""

    @field_validator("world_size")
    @classmethod
    def _positive_world_size(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be at least 1 or 'auto' (got {value})")
        return value

    @model_validator(mode="after")
    def _vllm_can_sample_and_place(self) -> PolicyConfig:
        if self.engine != "vllm":
            return self
        problem = vllm_sampling_problem(self.sampling.temperature, self.sampling.n, "policy.sampling.temperature")
        if problem:
            raise ValueError(problem)
        if self.device.startswith("cuda:") and self.device != "cuda:0":
            # vLLM 0.32's in-process executor puts its model on the first visible GPU whatever it is told, so the
            # trainer and the engine would sit on different GPUs.
            raise ValueError(
                f"policy.device {self.device!r} with policy.engine=vllm: vLLM uses the first visible GPU; choose it "
                f"with CUDA_VISIBLE_DEVICES={self.device.split(':', 1)[1]} and set policy.device=cuda:0 (or auto)"
            )
        return self

    @model_validator(mode="after")
    def _ranks_need_a_device_family(self) -> PolicyConfig:
        if self.world_size != 1 and self.device.startswith("cuda:"):
            raise ValueError(
                f"policy.device {self.device!r} names one GPU but policy.world_size is {self.world_size!r}; set "
                "policy.device=cuda (rank r uses cuda:r) and choose the GPUs with CUDA_VISIBLE_DEVICES"
            )
        return self


class AssistantConfig(StrictModel):
    """The assistant LLM that writes negatives and judges."""

    backend: Literal["transformers", "vllm", "openai"] = "transformers"
    """In-process transformers, in-process vLLM, or any OpenAI-compatible chat endpoint."""
    model: str = "tiny"
    """Hub id or local directory (transformers, vllm); "tiny" builds one locally."""
    base_url: str | None = None
    """OpenAI-compatible endpoint, e.g. http://host:8000/v1 (backend openai)."""
    api_key: SecretStr | None = None
    """API key for the endpoint."""
    model_name: str | None = None
    """Model name sent to the endpoint; None sends `model`."""
    concurrency: int = Field(default=8, ge=1)
    """Most assistant calls in flight at once, over all requests: concurrent HTTP calls (openai) or sequences per
    generate batch (transformers); vLLM schedules its own batch and ignores it."""
    request_timeout_s: float = Field(default=120.0, gt=0)
    """Timeout of one call to the endpoint."""
    retries: int = Field(default=2, ge=0)
    """Retries of an endpoint call that failed in transport or with 429/5xx (openai); then the RPC fails UNAVAILABLE."""
    device: str = "auto"
    """"auto" (cuda if present), "cpu" or "cuda:N" (transformers)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights dtype (transformers, vllm); auto = float32 on CPU, bfloat16 on GPU."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """vLLM's share of GPU memory; lower it when the GPU is shared with other services."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt plus answer in tokens (vllm; transformers cuts max tokens to fit); None uses the model's."""

    @model_validator(mode="after")
    def _openai_needs_url(self) -> AssistantConfig:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("assistant.backend 'openai' needs assistant.base_url (e.g. http://host:8000/v1)")
        return self


class GeneratorConfig(StrictModel):
    """Negative samples and the LLM judge. Candidates are checked by the verifier service at
    `verifier.server.address` (the one address every verifier client uses), with `verifier.server`'s deadline and
    retries."""

    server: GeneratorServerConfig = Field(default_factory=GeneratorServerConfig)
    """gRPC server of the generator service."""
    strategy: Literal["llm", "perturb", "varied"] = "perturb"
    """llm: the assistant rewrites the positive; perturb: rule-based change of the final answer; varied: rule-based,
    the kinds of wrong solutions an assistant writes (a wrong step, work stopped early, a bare wrong answer)."""
    attempts: int = Field(default=3, ge=1)
    """Candidates tried per item before giving up."""
    temperature: float = Field(default=0.7, ge=0)
    """Assistant sampling temperature for negatives."""
    extra_tokens: int = Field(default=500, ge=0)
    """Assistant max tokens = the positive's word count + extra_tokens."""
    judge_temperature: float = Field(default=0.0, ge=0)
    """Assistant sampling temperature for Judge; 0 is greedy, so a judgment is reproducible."""
    judge_max_tokens: int = Field(default=1024, ge=1)
    """Most tokens of one judgment (a short explanation, then `Final Judgment: Yes|No`)."""
    judge_ask_verdict: bool = True
    """A judgment that ends without a verdict line is continued, greedily, from an appended `Final Judgment:` line,
    and the model's next few words decide: a small judge explains and stops without the line (SmolLM2-135M-Instruct
    gave it in 3 replies of 32). The `openai` backend asks for it with vLLM's and SGLang's `continue_final_message`;
    turn this off for an endpoint without that extension."""
    assistant: AssistantConfig = Field(default_factory=AssistantConfig)
    """The assistant LLM."""


class SecurityConfig(StrictModel):
    """Who may call the gRPC services: a shared bearer token and TLS (mutual when a CA is given), the same for every
    service and client (docs/security.md). Health and reflection stay open, for probes."""

    token: SecretStr | None = None
    """Shared token: servers refuse every RPC without `authorization: Bearer <token>` (UNAUTHENTICATED), clients
    send it. None or empty: no token. Set it from a secret: COOPER_SECURITY__TOKEN."""
    tls_cert: str | None = None
    """PEM certificate (chain) of this process: servers serve TLS with it, clients present it when a server asks
    for a client certificate. Needs tls_key."""
    tls_key: str | None = None
    """PEM private key of tls_cert."""
    tls_ca: str | None = None
    """PEM CA bundle. Clients verify servers against it (TLS on for clients when this or tls_cert is set; without
    it, the system roots); servers given it require and verify client certificates (mTLS)."""
    tls_server_name: str | None = None
    """Name that clients check in server certificates instead of the host of the address, e.g. one certificate
    for all services, or 127.0.0.1 reached through a name; None checks the host."""

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        # An unset secret arrives as an empty variable (compose `${X:-}`, an empty Secret key): no token, not "".
        return None if value in ("", None) else value

    @model_validator(mode="after")
    def _cert_needs_key(self) -> SecurityConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("security.tls_cert and security.tls_key go together: set both or neither")
        return self

    @property
    def tls(self) -> bool:
        """Whether clients connect with TLS."""
        return self.tls_cert is not None or self.tls_ca is not None


class RedisConfig(StrictModel):
    """The job queue and run state."""

    url: str | None = None
    """redis://host:port/db, or redis://:PASSWORD@host:port/db for a server with `requirepass` (written masked to
    run directories and logs); None starts an embedded Redis server for the run."""
    key_prefix: str = "cooper"
    """Every key is <key_prefix>:<run id>:..., so runs and tests never share keys."""


class DataConfig(StrictModel):
    """Training and evaluation data."""

    preset: Literal["tiny", "files"] = "tiny"
    """tiny: a synthetic arithmetic task built locally; files: train_path and test_paths."""
    tiny_test_size: int = Field(default=64, ge=1)
    """Problems in each of the tiny task's two test sets, drawn by run.seed: `heldout`, two-step problems whose chain
    of operations and operands is held out of every split a model or the tokenizer learns from (the SFT warm start,
    the VerifyRM's pretraining, RL's prompts; cooper/tiny/task.py), and `seen`, new problems over the training
    arithmetic (in-distribution). A test accuracy over n problems x eval.k samples wanders by about
    sqrt(0.25 / (n k)): +-0.044 at 64 x 2, +-0.022 at 256 x 2."""
    tiny_two_step_share: float | None = Field(default=None, ge=0.0, le=1.0)
    """The share of two-step problems among the tiny task's training prompts and its `seen` test set (the rest are
    one-step; `heldout` is all two-step). None: the task's own, 0.5. 1.0 trains on problems shaped like the held-out
    ones (other chains of the same operations): for a model that already does one step, as a pretrained one does."""
    train_path: str | None = None
    """JSONL or parquet with `question` and `answer` (optional `id`, `data_source`)."""
    test_paths: dict[str, str] = Field(default_factory=dict)
    """Benchmark name -> JSONL or parquet file, evaluated separately."""
    prompt_template: str = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
    """Prompt built from a row: the paper's instruction. `{question}` is replaced by plain substitution (no
    str.format), so every other brace is literal: write `\\boxed{}`, not `\\boxed{{}}`."""

    @model_validator(mode="after")
    def _files_need_paths(self) -> DataConfig:
        if self.preset == "files" and not self.train_path:
            raise ValueError("data.preset 'files' needs data.train_path")
        if "{question}" not in self.prompt_template:
            raise ValueError("data.prompt_template must contain {question}")
        return self


class EvalConfig(StrictModel):
    """Evaluation on test problems."""

    every: int = Field(default=0, ge=0)
    """Evaluate every N steps (and at the end); 0 never."""
    k: int = Field(default=8, ge=1)
    """Samples per problem."""
    temperature: float = Field(default=0.7, ge=0)
    """Sampling temperature."""
    top_p: float = Field(default=0.95, gt=0, le=1)
    """Nucleus sampling."""
    max_problems: int | None = Field(default=None, ge=1)
    """Evaluate on the first N problems of each benchmark; None for all."""
    rm_benchmark_path: str | None = None
    """A labelled benchmark in VerifyBench's format (see `cooper eval-rm`), or `tiny` for one built from the tiny
    task: at every evaluation the reward model's current version scores it through the reward service, and
    metrics.jsonl gets rm_bench/accuracy (score > 0.5 says correct), rm_bench/auroc and rm_bench/reward_version.
    None: no such evaluation. Ignored in rule mode, which has no reward model."""

    @model_validator(mode="after")
    def _rm_benchmark_needs_evaluations(self) -> EvalConfig:
        if self.rm_benchmark_path and self.every == 0:
            raise ValueError("eval.rm_benchmark_path is scored at evaluations, but eval.every is 0: set eval.every")
        return self


Logger = Literal["tensorboard", "wandb", "mlflow"]
"""A tracker a run's metrics go to besides metrics.jsonl (RunConfig.loggers)."""


class WandbConfig(StrictModel):
    """Weights & Biases, when run.loggers names it. Unset fields fall back to W&B's own environment variables."""

    project: str | None = None
    """None: WANDB_PROJECT, else `cooper`."""
    entity: str | None = None
    """Team or user; None: WANDB_ENTITY, else the logged-in account's default."""
    mode: Literal["online", "offline"] | None = None
    """None: WANDB_MODE, else online. offline writes the run under runs/<name>/wandb/ for `wandb sync` later."""


class MlflowConfig(StrictModel):
    """MLflow, when run.loggers names it. Unset fields fall back to MLflow's own environment variables."""

    tracking_uri: str | None = None
    """A tracking server (http://host:5000) or a database (sqlite:///path/mlflow.db: the `mlflow` package, or
    `mlflow-skinny` with sqlalchemy and alembic); None: MLFLOW_TRACKING_URI, else runs/<name>/mlflow.db with the
    artifacts in runs/<name>/mlflow-artifacts/."""
    experiment: str | None = None
    """None: MLFLOW_EXPERIMENT_NAME, else `cooper`."""


class RunConfig(StrictModel):
    """One training run."""

    name: str | None = None
    """Run id and directory name under output_dir; None makes one from the time."""
    output_dir: str = "runs"
    """Parent of run directories."""
    mode: Literal["rule", "static", "cooper"] = "cooper"
    """rule: the verifier's 1/0; static: VerifyRM never updated; cooper: VerifyRM updated every step."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    steps: int = Field(default=100, ge=1)
    """Training steps."""
    batch_size: int = Field(default=8, ge=1)
    """Prompts per step (B)."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps; 0 only at the end."""
    service_restarts: int = Field(default=5, ge=0)
    """How many times a local run restarts each service it started when that service dies (it resumes from its
    latest checkpoint, and the run goes on); 0 never restarts. Services at a configured address are never
    restarted by the run: that is their supervisor's job (compose, Kubernetes)."""
    negatives: Literal["generator", "rollouts", "both"] = "generator"
    """Where cooper mode's negatives come from. generator (the paper's recipe): the generator rewrites each prompt's
    positive into a wrong solution (`generator.strategy`). rollouts (a variant, PRIME-style): every completion of the
    same group that the verifier marks INCORRECT or NO_ANSWER is paired with the positive, so VerifyRM is trained on
    exactly what the policy writes now, malformed text included. The verifier then picks negatives, which the paper
    avoids because of its false negatives (correct answers in unusual forms marked INCORRECT); TIMEOUT and ERROR
    verdicts are never used, and a false negative costs one mislabelled pair among many, while a blind spot that the
    policy exploits costs the run. both: the two together, so that a prompt whose rollouts are all right still gives
    a pair (the generator's) and the pairs do not run out as the policy improves."""
    max_staleness: int = Field(default=0, ge=0)
    """How many versions behind the trainer a rollout may be sampled. 0 (the paper's synchronous GRPO): rollout(t)
    waits for policy_update(t-1) and samples version t. k > 0 (one-step-off-policy when 1, as verl's recipe,
    prime-rl and AReaL): rollout(t) waits only for policy_update(t-k-1) and samples version max(0, t-k), so the
    policy service generates step t while it trains step t-1, from a copy of the weights of its own (a second
    process with the transformers engine; vLLM's engine with vLLM). The update then recomputes pi_old with the
    trainer's current weights and weights each token by min(pi_old / pi_sampled, policy.grpo.rollout_is_cap), the
    sampled log-probs being the ones Generate returned: truncated importance sampling (verl's TIS; AReaL's decoupled
    objective drops the tokens over the cap instead); the cap is 2.0 when unset. The policy refuses a Train whose
    rollout is more than k versions behind its trainer, or behind it without log-probs. Each step still scores with
    VerifyRM v_t unless run.reward_max_staleness says otherwise. docs/training.md, "Rollouts ahead of training"."""
    reward_max_staleness: int = Field(default=0, ge=0)
    """Cooper mode: how many updates behind VerifyRM's trainer a step's scores may be. 0 (the paper's order):
    score(t) waits for reward_update(t-1) and reads v_t. k > 0: score(t) reads exactly v_{max(0, t-k)}, and
    reward_update(t) waits for score(t+k), so VerifyRM's update runs beside the policy's update and the next
    rollout instead of before them (the stages refuse a score from any other version; the run stays deterministic).
    The run's state, not the reward service's: the service only ever holds its newest version. docs/training.md,
    "The reward update beside the policy's"."""
    loggers: list[Logger] = Field(default_factory=lambda: list[Logger](["tensorboard"]))
    """Trackers that get every step's metrics besides metrics.jsonl (always written), under the same names: any of
    tensorboard (runs/<name>/tensorboard/), wandb (run.wandb; `pip install wandb`), mlflow (run.mlflow; `pip install
    mlflow`). W&B and MLflow also get the resolved config, the alarm's raises and clears (W&B alerts, MLflow
    tags) and plot.png at the end; `cooper train --resume` continues the same tracked run. docs/training.md,
    "Weights & Biases and MLflow"."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases settings (used when run.loggers names wandb)."""
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    """MLflow settings (used when run.loggers names mlflow)."""

    @field_validator("loggers")
    @classmethod
    def _loggers_once(cls, loggers: list[str]) -> list[str]:
        if len(set(loggers)) != len(loggers):
            raise ValueError(f"run.loggers names a tracker twice: {loggers}")
        return loggers



ALARM_REACTION_STEPS = 2
"""In act mode, how many steps the stages that take the alarm's actions may run ahead of the driver's log."""

AlarmAction = Literal["verifier_reward", "rm_negatives", "rollback"]
"""What the alarm may do while it is up, in act mode (AlarmConfig.actions)."""


class AlarmConfig(StrictModel):
    """The reward-hacking alarm (cooper/evaluation/alarm.py): a sequential test, every step, on how VerifyRM and the
    verifier disagree about the same rollouts. Off in rule mode, where no reward model runs. It never changes the
    reward itself while quiet (a reward that included the alarm would teach the policy to hide the hack)."""

    mode: Literal["off", "warn", "act"] = "warn"
    """off; warn: every raise and clear is logged (alarms.jsonl, the log, metrics.jsonl's alarm/* keys, the plot);
    act: the same, and `actions` are taken while the alarm is up."""
    actions: list[AlarmAction] = Field(default_factory=lambda: list[AlarmAction](["verifier_reward"]))
    """In act mode, taken together while the alarm is up. verifier_reward: the policy is trained on the verifier's
    1/0 reward (rule mode's) until the alarm clears. rm_negatives (cooper mode; ignored in static mode, whose
    reward model never trains): VerifyRM's update takes `rm_update_factor` times reward.update_steps optimizer
    steps, and the flagged false positives (rollouts it accepted and the verifier rejected) join its pairs as
    negatives, each against its prompt's verified positive. rollback: once per raise, when it comes into force,
    the next policy update is skipped and the policy service restores its newest kept checkpoint from before the
    onset (the last step at which every CUSUM statistic was 0) as its next version; how far back it can reach is
    policy.keep_checkpoints x policy.save_every versions, and when no checkpoint that old is kept, the initial
    policy is restored."""
    escalate_after: int | None = Field(default=None, ge=1)
    """In act mode, None: every action in `actions` is taken from the raise. N: graded, in the order listed: the
    first action from the raise, and the next joins each time the alarm has stayed up N more steps (for example
    `actions: [rm_negatives, verifier_reward, rollback]`, `escalate_after: 20`: VerifyRM learns harder first, the
    verifier's reward after 20 steps still up, the rollback after 40)."""
    rm_update_factor: int = Field(default=4, ge=1)
    """rm_negatives: how many times reward.update_steps an update takes while the alarm is up."""
    latch: bool = False
    """In act mode, keep the actions in force for the rest of the run once the alarm has raised, even after it
    clears. With a frozen reward model (static mode) the alarm otherwise cycles: it clears once the policy, trained
    on the verifier, stops writing what the RM overpays, and the RM's reward draws it back (docs/experiments.md)."""
    baseline_steps: int = Field(default=30, ge=2)
    """Steps whose signals fit the baseline; the alarm cannot raise before."""
    false_alarm_rate: float = Field(default=0.1, gt=0, lt=1)
    """Chance of a false alarm over a whole run of run.steps whose reward model is not being exploited (calibrated
    on simulated runs; sets the threshold)."""
    drift: float = Field(default=0.5, gt=0)
    """CUSUM allowance k: the excess, in baseline spreads, a step must show to count as evidence."""
    clear_steps: int = Field(default=10, ge=1)
    """The alarm clears once every signal's mean excess over this many steps is back under `drift`."""
    threshold: float | None = Field(default=None, ge=0)
    """The CUSUM threshold h itself, instead of the one calibrated for `false_alarm_rate` (for a threshold fitted on
    one's own runs)."""
    false_positive_margin: float = Field(default=0.1, ge=0, lt=1)
    """The absolute check (cooper/evaluation/exploit_check.py), which needs no baseline and so sees a reward model
    exploited from the first step: it raises when the share of verifier-rejected rollouts that VerifyRM accepts runs
    above a bound, the upper 95% limit of its false-positive rate on eval.rm_benchmark_path's wrong items at the
    initial evaluation plus this margin (for the verifier's false negatives and wrong answers unlike the
    benchmark's). Without eval.rm_benchmark_path or `false_positive_bound` the check is off."""
    false_positive_bound: float | None = Field(default=None, gt=0, lt=1)
    """The absolute check's bound itself (e.g. from `cooper eval-rm`'s false_positive_rate, plus a margin), instead
    of the one from eval.rm_benchmark_path."""

    @field_validator("mode", mode="before")
    @classmethod
    def _off_is_not_false(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare `off` as false


STALE_ROLLOUT_IS_CAP = 2.0
"""policy.grpo.rollout_is_cap when run.max_staleness > 0 leaves it unset: verl's default for its rollout_is."""


class CooperConfig(StrictModel):
    """Everything a Cooper run or service needs."""

    run: RunConfig = Field(default_factory=RunConfig)
    """The run."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Data."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Evaluation."""
    redis: RedisConfig = Field(default_factory=RedisConfig)
    """Queue and state."""
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    """Verifier service."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """Reward service."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """Policy service."""
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig)
    """Generator service."""
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    """Token and TLS of every gRPC server and client."""
    alarm: AlarmConfig = Field(default_factory=AlarmConfig)
    """The reward-hacking alarm."""

    @model_validator(mode="after")
    def _rollouts_ahead_stay_exact(self) -> CooperConfig:
        """run.max_staleness > 0: the importance cap the update needs (2.0 unless set), and the checkpoints a
        restarted policy service rebuilds the versions behind it from."""
        behind = self.run.max_staleness
        if not behind:
            return self
        if self.policy.grpo.rollout_is_cap is None:
            self.policy.grpo.rollout_is_cap = STALE_ROLLOUT_IS_CAP
        if self.policy.journal and (self.policy.save_every < behind or self.policy.keep_checkpoints < 2):
            raise ValueError(
                f"run.max_staleness={behind} needs policy.save_every >= {behind} and policy.keep_checkpoints >= 2 "
                f"(got {self.policy.save_every} and {self.policy.keep_checkpoints}): a restarted policy service "
                "rebuilds the versions its next rollouts sample from out of the checkpoint before the newest one")
        if self.alarm.mode == "act" and "rollback" in self.alarm.actions:
            raise ValueError("alarm.actions=rollback needs run.max_staleness=0: a rollback restores the weights the "
                             "step's rollout was sampled from, which ahead-of-training rollouts are not")
        return self

    @model_validator(mode="after")
    def _reward_updates_behind_reach_the_alarm(self) -> CooperConfig:
        """In act mode each action reaches the stages two steps after a raise, and reward_update(t) waits for the
        driver to log step t-2; a reward update further behind than that would wait for a step that waits for it."""
        behind = self.run.reward_max_staleness
        if self.alarm.mode == "act" and behind > ALARM_REACTION_STEPS:
            raise ValueError(f"run.reward_max_staleness={behind} with alarm.mode=act: at most {ALARM_REACTION_STEPS} "
                             "(the alarm's actions reach the stages that many steps after a raise)")
        return self

    @model_validator(mode="after")
    def _vllm_accepts_every_sampling(self) -> CooperConfig:
        """The samplings the policy's and the assistant's vLLM engines will be asked for, besides the rollout's."""
        checks = []
        if self.policy.engine == "vllm":
            checks.append((self.eval.temperature, self.eval.k, "eval.temperature"))
        if self.generator.assistant.backend == "vllm":
            checks += [(self.generator.temperature, 1, "generator.temperature"),
                       (self.generator.judge_temperature, 1, "generator.judge_temperature")]
        for temperature, n, key in checks:
            problem = vllm_sampling_problem(temperature, n, key)
            if problem:
                raise ValueError(problem)
        return self


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, origin: str) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"{origin}: empty key")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: '{'.'.join(parts[: i + 1])}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _parse_scalar(text: str) -> Any:
    # YAML scalars, so `steps=5`, `stop=["\n"]` and `token=null` mean what they say.
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`COOPER_REWARD__HTTP__PORT=8001` -> {"reward": {"http": {"port": 8001}}}."""
    tree: dict[str, Any] = {}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or ENV_NESTING not in name:
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace(ENV_NESTING, ".")
        _set_dotted(tree, dotted, _parse_scalar(text), f"environment variable {name}")
    return tree


def cli_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """["reward.http.port=8001", "run.steps=5"] -> nested dict."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"override '{item}' is not of the form section.key=value")
        _set_dotted(tree, key.strip(), _parse_scalar(text), f"override '{item}'")
    return tree


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (presets live in configs/)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    return data


def describe_errors(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown config key '{where}'")
        else:
            lines.append(f"config key '{where}': {e['msg']}")
    return f"{origin}: " + "; ".join(lines)


def presets_dir() -> Path:
    """Where the presets are: cooper/configs/ in an installed wheel (setup.py puts configs/ there), else configs/
    of the checkout this package runs from (an editable install)."""
    packaged = Path(__file__).resolve().parent / "configs"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "configs"


def preset_path(name: str | None) -> str | None:
    """A bare preset name ("tiny") means <name>.yaml of the presets; a path is left as it is."""
    if name is None or os.sep in name or name.endswith((".yaml", ".yml")):
        return name
    return str(presets_dir() / f"{name}.yaml")


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> CooperConfig:
    """Build the config from a YAML file, the environment and dotted overrides; ConfigError names any bad key."""
    tree: dict[str, Any] = read_yaml(path) if path else {}
    tree = _merge(tree, env_overrides(os.environ if environ is None else environ))
    tree = _merge(tree, cli_overrides(overrides))
    origin = f"config {path}" if path else "config"
    try:
        return CooperConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(describe_errors(err, origin)) from None


def with_overrides(config: CooperConfig, overrides: Sequence[str]) -> CooperConfig:
    """A copy of `config` with dotted overrides applied and validated like any other source."""
    return CooperConfig.model_validate(_merge(config.model_dump(mode="python"), cli_overrides(overrides)))


def to_yaml(config: CooperConfig) -> str:
    """The resolved config as YAML (secrets masked), for run directories and `cooper config show`."""
    data = config.model_dump(mode="json")
    if data["redis"]["url"]:
        data["redis"]["url"] = mask_url_password(data["redis"]["url"])
    return yaml.safe_dump(data, sort_keys=False)


def mask_url_password(url: str) -> str:
    """redis://:secret@host:6379/0 -> redis://:**********@host:6379/0 (what SecretStr shows), for files and logs."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:**********@{host}"
