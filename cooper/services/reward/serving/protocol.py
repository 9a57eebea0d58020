"""Request and response models of the reward service's HTTP API (pydantic only; FastAPI lives in http.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreItemIn(_Strict):
    """One completion; the model sees the template of docs/design.md section 2.5 built from these three texts."""

    question: str
    reference: str
    completion: str


class ScoreRequest(_Strict):
    """Invariant: at most reward.http.max_items items, each text at most reward.http.max_chars (else 413)."""

    items: list[ScoreItemIn]


class ScoreOut(BaseModel):
    score: float = Field(description="sigmoid(logit) in [0, 1]; 1[sigmoid(logit) > 0.5] with reward.discrete")
    logit: float = Field(description="raw model output")


class ScoreResponse(BaseModel):
    """Invariant: `scores` has the length of `items`, in order, and every score came from model `version`."""

    scores: list[ScoreOut]
    version: int


class LearnResponse(BaseModel):
    """What one learning step did (reward.learn_online): the scored completions since the last step, checked by the
    rule verifier, paired per question (first right against each wrong), one Bradley-Terry update when any pair."""

    version: int = Field(description="VerifyRM's version after the step: one more than before when it had pairs")
    completions: int = Field(description="scored completions the step took")
    correct: int = Field(description="verified right")
    rejected: int = Field(description="verified wrong (INCORRECT or NO_ANSWER)")
    unchecked: int = Field(description="the verifier timed out or failed on them: never paired")
    pairs: int = Field(description="preference pairs the update trained on")
    pair_accuracy_before: float | None = Field(description="share of the pairs ranked right before the update")
    pair_accuracy_after: float | None = Field(description="the same after it")
    dropped: int = Field(description="completions dropped since the last step because the buffer was full "
                                     "(reward.learn_online.max_buffered)")


class ServingSettings(BaseModel):
    """The batching and model processes in effect: the config's, with what it left unset chosen at start-up."""

    model_copies: int = Field(description="model processes, each a whole copy of the model (reward.model_copies)")
    max_batch_size: int = Field(description="most sequences in one forward pass (reward.batching.max_batch_size)")
    max_wait_ms: float = Field(description="how long a request may wait for others to join its batch")
    max_inflight: int = Field(description="batches handed to each model process and not yet answered")
    spread: bool = Field(description="batches cut no larger than the items outstanding over the batch slots "
                                     "(reward.batching.spread)")
    spread_waits_ms: list[float] | None = Field(
        default=None, description="with spreading and the wait chosen at start-up: how long a batch cut to 1, 2, ... "
                                  "items may wait (a quarter of its own forward pass; index 0 unused)")
    tokenize_in_model: bool = Field(default=False, description="the model processes tokenize, a batch at a time, "
                                                               "not the serving process (reward.tokenize_in_model)")
    cpu_linear: str = Field(default="torch", description="how scoring passes run the linear layers: torch's own or "
                                                          "oneDNN's (reward.cpu_linear; chosen at start-up by default)")


class ModelResponse(BaseModel):
    model: str = Field(description="hub id or local directory of the base model")
    version: int = Field(description="current model version; each applied update adds one")
    parameters: int
    device: str
    last_key: str = Field(description="last applied idempotency key, '<run_id>/<step>', empty if none")
    checkpoint: str = Field(description="latest checkpoint directory, empty if none")
    role: str = Field(description="'trainer' (applies updates, writes checkpoints) or 'replica' (serves the "
                      "trainer's checkpoints)")
    trainer_version: int = Field(description="replica: newest checkpoint version it has seen from the trainer; "
                                 "trainer: its version")
    lag_s: float = Field(description="replica: seconds a newer checkpoint has waited to be loaded; 0 when current")
    stale: bool = Field(description="replica: past reward.replica's max_lag_s or max_versions_behind")
    serving: ServingSettings


class StatusResponse(BaseModel):
    status: str
    version: int


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's remote reward model request. With `labels`: `query[i]` is `prompts[i]` followed by the
    completion and `labels[i]` is the reference answer (one entry per sample in each list). Without `labels` (older
    OpenRLHF clients send only `query`), or for an empty label (newer ones send "" without --label_key): the
    reference travels in the query, which must then hold the VerifyRM template text (docs/design.md section 2.5;
    anything before `<question>`, such as chat markup, is dropped, and the closing `</completion>` may be missing);
    a query without it is refused (422), since VerifyRM cannot judge a completion without its reference. Unknown keys are ignored, since OpenRLHF versions send different extras."""

    query: list[str]
    prompts: list[str] | None = Field(default=None, description="required with labels")
    labels: list[str] | None = Field(default=None, description="reference answers; without them, or where one is "
                                     "empty, the query must hold the VerifyRM template text")


class OpenRLHFResponse(BaseModel):
    """`rewards` and `scores` have the length of `query`, in order; OpenRLHF reads `rewards`."""

    rewards: list[float]
    scores: list[float] = Field(description="sigmoid(logit), whatever reward.discrete says")
    version: int
    extra_logs: dict[str, list[float]] = Field(description="per-sample values OpenRLHF logs: the model version")


# The VerifyRM template as a JSON Schema pattern (ECMA-262 has no DOTALL, hence [\s\S]); verify_rm.INPUT_PATTERN is
# what the handler matches, with the same meaning.
TEMPLATE_PATTERN = (r"^<question>[\s\S]*</question>\n<reference_answer>[\s\S]*</reference_answer>\n"
                    r"<completion>[\s\S]*$")
TemplateText = Annotated[str, WithJsonSchema({"type": "string", "pattern": TEMPLATE_PATTERN})]


class ClassificationRequest(BaseModel):
    """vLLM's `/classify` request (vllm/entrypoints/pooling/classify/protocol.py), as SGLang and verl's reward loop
    send it. Each input is the VerifyRM template text of docs/design.md section 2.5,
    `<question>Q</question>\\n<reference_answer>R</reference_answer>\\n<completion>C</completion>`: that text is
    what the model reads, so a classifier client scores a triple by sending it (400 for any other text). Token-id
    and chat inputs are not accepted. `model` is not checked (the service serves one model; the answer names it).
    Unknown keys are ignored, as vLLM does (`activation` and `softmax` among them: vLLM 0.32 reads only
    `use_activation`); known ones must have their declared JSON type (no "1" for 1). Refusals are vLLM's: 400 and
    the others in ClassificationErrorResponse."""

    model_config = ConfigDict(strict=True)

    model: str | None = None
    input: TemplateText | list[TemplateText]
    use_activation: bool | None = Field(default=None, description="false: `probs` holds the raw logit "
                                        "(verl's reward loop asks for that); default true: sigmoid(logit)")
    normalize: bool | None = Field(default=None, description="refused (400), as vLLM 0.32 refuses it: send "
                                   "use_activation")
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, description="accepted and ignored: inputs are cut "
                                               "to reward.max_length tokens from the start of the completion")


class ClassificationData(BaseModel):
    index: int
    label: str = Field(description="the model's id2label entry of its one class (\"LABEL_0\" unless the model's "
                       "config names it), as vLLM answers")
    probs: list[float] = Field(description="one class: [sigmoid(logit)], or [logit] with use_activation=false; "
                               "reward.discrete does not apply")
    num_classes: int = Field(description="1: VerifyRM has one output")


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


class ClassificationResponse(BaseModel):
    """vLLM's `/classify` answer: `data` has one entry per input, in order (`index`), all from model `version`
    (a field vLLM does not have, which its clients ignore)."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo
    version: int


class ClassificationErrorDetail(BaseModel):
    message: str = Field(description="what went wrong and what to do")
    type: str = Field(description="vLLM's: 'Bad Request' for a body of the wrong shape, 'BadRequestError' for "
                      "other invalid requests, else the status's phrase ('Unauthorized', 'Service Unavailable')")
    param: str | None = Field(default=None, description="the field at fault, as 'body.input', when known")
    code: int = Field(description="the HTTP status")


class ClassificationErrorResponse(BaseModel):
    """vLLM's error body (vllm/entrypoints/serve/engine/protocol.py ErrorResponse), every refusal of /classify, so
    that vLLM's clients read them as vLLM's own. The other routes answer in ErrorResponse."""

    error: ClassificationErrorDetail


class ErrorDetail(BaseModel):
    type: str = Field(description="unauthorized, too_large, invalid_request, overloaded, not_found, "
                                  "method_not_allowed, not_ready, stale, model_unavailable, internal")
    message: str = Field(description="what went wrong and what to do")


class ErrorResponse(BaseModel):
    """The one error schema of every non-2xx answer."""

    error: ErrorDetail
