"""The names of a training step's metrics record, in one place: the keys of a metrics.jsonl line that one module
writes and another reads.

The driver writes each step's record (orchestrator/run.py `step_record`, the alarm's keys in
orchestrator/alarm_watch.py); the alarm, the experiment's verdict, its figures and tables, and the benchmarks read
it back. Each reads the same name from here, so a rename is one edit. The values are on disk: every metrics.jsonl
and the alarm's regression data use them, so a value never changes. Keys only their writer reads (no_answer_rate,
policy_staleness, prompt_ids, data_epoch, ...) stay where they are written. A name ending in "/" is a prefix: the
key is the prefix and a benchmark's, stage's or policy metric's name (`TEST + "heldout"`). No imports: anything may
import this.
"""

# ----- the step ------------------------------------------------------------------------------------------------------

STEP = "step"
"""The step's index, from 0; one record per step (a resumed run's repeat of a step: the last line wins)."""
MODE = "mode"
"""The run's reward mode (cooper/modes.py): "rule", "static" or "cooper"."""

# ----- rollouts and the verifier ------------------------------------------------------------------------------------

REWARD_MEAN = "reward_mean"
"""Mean of the reward the policy trained on over the step's rollouts (the proxy)."""
VERIFIER_ACCURACY = "verifier_accuracy"
"""Share of the step's rollouts the verifier marks CORRECT (the gold)."""
ROLLOUTS = "rollouts"
"""How many rollouts the step scored (with VerifyRM scoring): the alarm's trial count."""

# ----- VerifyRM's health on the policy's rollouts (modes where VerifyRM scores) ---------------------------------------

RM_VERIFIER_DISAGREEMENT = "rm_verifier_disagreement"
"""Share of the step's rollouts where VerifyRM (reward > 0.5) and the verifier disagree."""
REWARD_ACCURACY_GAP = "reward_accuracy_gap"
"""The proxy-gold gap: the step's mean reward minus its verifier accuracy, on the same rollouts."""
RM_AUROC = "rm_auroc"
"""AUROC of VerifyRM's logits for telling verifier-correct from verifier-wrong rollouts; None with one class only."""
RM_AUROC_SUPPORT = "rm_auroc_support"
"""Rollouts in the smaller of the two classes RM_AUROC ranks (correct or wrong)."""
RM_FALSE_POSITIVE_RATE = "rm_false_positive_rate"
"""Share of the verifier-wrong rollouts that VerifyRM accepts (logit > 0)."""
RM_FALSE_POSITIVES_BY_PROMPT = "rm_false_positives_by_prompt"
"""Per prompt of the step, in the batch's order: [verifier-wrong rollouts VerifyRM accepts, verifier-wrong rollouts]
of its group; the alarm's absolute check counts prompts, not rollouts (cooper/evaluation/exploit_check.py)."""

# ----- the policy ---------------------------------------------------------------------------------------------------

KL_FROM_INITIAL = "kl_from_initial"
"""KL(policy || initial policy) per completion, in nats; only where the policy measures KL against its start."""
POLICY = "policy/"
"""Prefix of the policy update's own metrics, as the policy service reports them (`policy/kl`, ...)."""
POLICY_KL = "kl"
"""Of the policy update's metrics (under POLICY): the token-mean k3 estimate of KL against the initial policy."""
POLICY_KL_SEQ = "kl_seq"
"""Of the policy update's metrics: KL against the initial policy per completion; present only where the policy
measures KL against its initial weights (a reference model is loaded)."""
POLICY_RESPONSE_LENGTH = "response_length"
"""Of the policy update's metrics: the mean completion length, in tokens."""

# ----- versions and where the reward came from ------------------------------------------------------------------------

POLICY_VERSION = "policy_version"
"""The policy's version after the step's update."""
POLICY_VERSION_SAMPLED = "policy_version_sampled"
"""The policy version that sampled the step's rollouts."""
REWARD_VERSION_USED = "reward_version_used"
"""The VerifyRM version that scored the step's rollouts (-1 in rule mode)."""
REWARD_VERSION = "reward_version"
"""VerifyRM's version after the step's update (modes where VerifyRM learns)."""
REWARD_SOURCE = "reward_source"
"""Where the policy's reward came from this step: "reward_model", "verifier", or "rollback" (the alarm's)."""

# ----- VerifyRM's update (modes where VerifyRM learns) ----------------------------------------------------------------

PAIRS = "pairs"
"""Preference pairs in the step's VerifyRM update."""
PAIR_ACCURACY_BEFORE = "pair_accuracy_before"
"""Share of the update's pairs VerifyRM ranked right before it; None without pairs."""
PAIR_ACCURACY_AFTER = "pair_accuracy_after"
"""Share of the update's pairs VerifyRM ranks right after it; None without pairs."""

# ----- evaluations --------------------------------------------------------------------------------------------------

TEST = "test/"
"""Prefix of test accuracy per benchmark after the step's update (`test/heldout`), on steps that evaluate."""
TEST_INITIAL = "test_initial/"
"""Prefix of the initial policy's test accuracy per benchmark, before any update (step 0's record)."""
RM_BENCH = "rm_bench/"
"""Prefix of VerifyRM's scores on the labelled benchmark (eval.rm_benchmark_path), on steps that evaluate."""
RM_BENCH_INITIAL = "rm_bench_initial/"
"""Prefix of the initial VerifyRM's scores on the labelled benchmark (step 0's record)."""
RM_BENCH_ACCURACY = "rm_bench/accuracy"
"""Share of the labelled benchmark's items VerifyRM judges as its labels do (score > 0.5 says correct)."""
RM_BENCH_INITIAL_FALSE_POSITIVE_RATE = "rm_bench_initial/false_positive_rate"
"""Share of the benchmark's wrong items the initial VerifyRM accepts: the alarm's absolute check's validation."""
RM_BENCH_INITIAL_NEGATIVES = "rm_bench_initial/negatives"
"""How many wrong items RM_BENCH_INITIAL_FALSE_POSITIVE_RATE is a share of."""
TIME = "time/"
"""Prefix of a stage's seconds for the step (`time/rollout`), a worker's wall time for the job."""
CRITICAL = TIME + "critical/"
"""Prefix of a stage's seconds on the step's critical path (`time/critical/rollout`; 0 when the step did not wait on
it): run.critical_path. With `time/<stage>`, what a mode's stages cost the step, not only how long they ran."""
CRITICAL_QUEUE = "queue"
"""The part of the critical path between jobs (`time/critical/queue`): Redis hops and waiting for a free worker."""
ELAPSED = TIME + "elapsed"
"""Seconds from the start of stepping (of this process: a resumed run starts again from 0) to the step being logged:
the wall-clock axis of a learning curve (time to an accuracy, bench/rollouts_ahead.py)."""

# ----- the reward-hacking alarm -------------------------------------------------------------------------------------

ALARM_STATE = "alarm/state"
"""The alarm after this step: "baseline", "clear" or "alarm"; only in runs the alarm watches."""
ALARM_STATISTIC = "alarm/statistic"
"""The alarm's highest statistic this step, on the scale of ALARM_THRESHOLD."""
ALARM_THRESHOLD = "alarm/threshold"
"""h: the statistic above which the alarm raises."""
ALARM_EVENT = "alarm/event"
""""raised" or "cleared", on the steps where the alarm went up or down."""
ALARM_ROLLED_BACK_TO = "alarm/rolled_back_to"
"""The policy version the alarm's rollback restored, on the step whose update it took."""
ALARM_RM_NEGATIVES = "alarm/rm_negatives"
"""Whether the alarm's rm_negatives action was in force in this step's VerifyRM update (more optimizer steps, and
the rollouts it accepted and the verifier rejected among its negatives)."""
