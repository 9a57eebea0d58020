"""What a Cooper step costs against a rule step on GPUs, per layout: a cost model from stated assumptions (estimates,
nothing run on a GPU), to be replaced by the per-stage times of a real run (metrics.jsonl's `time/*`).

    python bench/cost_model.py [--gpus 8] [--prompts 64] [--n 16] [--answer-tokens 350] [--decode-ms 7] ...

Every assumption is a flag (`--help` lists them with their defaults: a 1.5B policy and VerifyRM, a 7B assistant
writing the negatives, 64 prompts x 16 rollouts, 8 H100s). The parts of a step, in seconds:

- rollout: `decode_steps` decode steps at `decode_ms` each (decoding is latency-bound: the batch's longest answer
  sets the step count) plus the prompts' prefill at `prefill_mfu`;
- policy update: the old log-probs and the reference's (2N FLOPs a token each) and the update (6N, 8N with
  activation recomputation) over prompt + answer tokens, at `train_mfu`;
- VerifyRM scoring: 2N_rm a token over every rollout with its question and reference, at `prefill_mfu`;
- Bradley-Terry update: the same as the policy's update over `pairs` x 2 texts, plus the optimizer step; with
  VerifyRM offloaded to CPU (the released recipe) its weights and optimizer state cross PCIe twice an update;
- negatives: the assistant decodes one rewrite per pair (`negative_tokens` decode steps at `assistant_decode_ms`).

Layouts (each step's time in steady state). The released recipe runs a step's parts one after another. Cooper's
step graph keeps the paper's order (score(t+1) reads VerifyRM v_{t+1}) but the next rollout waits only for the
policy's update: the negatives and VerifyRM's update of step t run beside the policy's update and the next rollout,
so they cost the step only what they take on the policy's GPUs, or what they take beyond those two parts:
- `rule`: rollout, update, all GPUs. `static`: rule plus VerifyRM's scoring on all GPUs.
- `cooper-released`: the released recipe's order: negatives, scoring and the Bradley-Terry update serial before the
  policy update, VerifyRM offloaded to CPU between uses; its assistant a service on one GPU more (as in the next
  two layouts: `gpus` in the JSON says how many each uses).
- `cooper-overlapped`: Cooper's graph, VerifyRM offloaded to CPU between uses, scoring and updating on the policy's
  GPUs.
- `cooper-colocated`: Cooper's graph, VerifyRM scoring and updating on the policy's GPUs, time-sliced, its weights
  and optimizer state resident.
- `cooper-colocated-same-gpus`: the same on the hardware `rule` has: the assistant on one of the `gpus`, the policy
  and VerifyRM on the rest.
- `cooper-split`: Cooper's graph with the policy on `gpus - 2`, VerifyRM on 1, the assistant on 1 (one GPU per
  service): rollout and update slow down by the GPUs they lose, and scoring on one GPU gates the update.
- `cooper-side-gpu`: the policy on `gpus - 1`; VerifyRM and the assistant share the last GPU, time-sliced (their
  work there adds up, and the step is at least that long).
- `cooper-colocated-unsharded`: VerifyRM resident on one of the policy's GPUs as one process (the reward service
  trains on one device): its scoring and update add to that GPU's time, and the policy's ranks, which meet at every
  collective, wait for it; the assistant on a GPU of its own.

The `cooper-colocated` layouts need VerifyRM sharded over the policy's GPUs; Cooper's reward service runs on one
device, so of what it ships, `cooper-side-gpu` and `cooper-colocated-unsharded` are the layouts it can run today
(docs/operations.md, "Where VerifyRM and the assistant run").

Memory per GPU (GB) for each layout: weights, gradients and AdamW state (`bytes_per_param_trained`) sharded over the
GPUs a model trains on, frozen weights (`bytes_per_param_frozen`) likewise; the rest is vLLM's KV cache.

The last line printed is one JSON object: each layout's step seconds, its ratio to `rule` on all GPUs, and memory.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Assumptions:
    gpus: int = 8
    peak_tflops: float = 989.0  # H100 SXM dense bf16
    train_mfu: float = 0.30
    prefill_mfu: float = 0.45
    prompts: int = 64
    n: int = 16
    prompt_tokens: int = 150
    answer_tokens: int = 350
    reference_tokens: int = 20
    decode_steps: int = 1100  # the longest answer of the batch: the tail, not the mean, sets it
    decode_ms: float = 7.0
    policy_params: float = 1.54e9
    rm_params: float = 1.31e9
    assistant_params: float = 7.6e9
    pairs: int = 64  # the released recipe: at most one pair a prompt
    negative_tokens: int = 350
    assistant_decode_ms: float = 21.0  # a 7B model's decode step on one GPU
    recompute: bool = True  # activation recomputation: 8N a trained token instead of 6N
    optimizer_s: float = 0.1  # AdamW's step over VerifyRM, resident
    pcie_gbps: float = 25.0  # host <-> GPU, for the offloaded VerifyRM
    bytes_per_param_trained: float = 16.0  # bf16 weights and grads, fp32 master and two AdamW moments
    bytes_per_param_frozen: float = 2.0  # bf16
    gpu_memory_gb: float = 80.0


def parts(a: Assumptions) -> dict[str, float]:
    """Each part of a step in seconds on all `a.gpus` GPUs (scoring and the Bradley-Terry update also on one GPU)."""
    flops_per_s = a.peak_tflops * 1e12
    rollouts = a.prompts * a.n
    trained = 8.0 if a.recompute else 6.0
    prefill = 2 * a.policy_params * rollouts * a.prompt_tokens / (a.gpus * flops_per_s * a.prefill_mfu)
    rollout = a.decode_steps * a.decode_ms / 1000 + prefill
    sequence = a.prompt_tokens + a.answer_tokens
    update_flops = (trained + 2 + 2) * a.policy_params * rollouts * sequence  # update, old log-probs, reference
    scored = 2 * a.rm_params * rollouts * (sequence + a.reference_tokens)
    bt_flops = trained * a.rm_params * a.pairs * 2 * (sequence + a.reference_tokens)
    offload = 2 * a.rm_params * a.bytes_per_param_trained / (a.pcie_gbps * 1e9)  # out and back, every update
    return {
        "rollout": rollout,
        "policy_update": update_flops / (a.gpus * flops_per_s * a.train_mfu),
        "rm_score": scored / (a.gpus * flops_per_s * a.prefill_mfu),
        "rm_score_one_gpu": scored / (flops_per_s * a.prefill_mfu),
        "rm_update": bt_flops / (a.gpus * flops_per_s * a.train_mfu) + a.optimizer_s,
        "rm_update_one_gpu": bt_flops / (flops_per_s * a.train_mfu) + a.optimizer_s,
        "rm_offload": offload,
        "negatives": a.negative_tokens * a.assistant_decode_ms / 1000,
    }


def layouts(a: Assumptions) -> dict[str, dict[str, float]]:
    """Each layout's step time, its ratio to `rule` on all `gpus`, the GPUs it uses and its memory per GPU."""
    p = parts(a)

    def on(gpus: int) -> float:
        """How much longer the policy's parts take on `gpus` than on all of them. Decoding is latency-bound, but
        the same batch over fewer GPUs holds more sequences on each: counted in full, as throughput."""
        return a.gpus / gpus

    def pipelined(policy_gpu_s: float, beside_s: float) -> float:
        """Cooper's step graph in steady state: score(t+1) starts when rollout(t+1) has ended (after the policy's
        update of t) and VerifyRM's update of t has (after the negatives of t). `policy_gpu_s` is all the work on
        the policy's GPUs a step (time-sliced there, it adds up), `beside_s` the chain negatives -> VerifyRM's
        update that runs beside the policy's update and the next rollout."""
        return max(policy_gpu_s, beside_s)

    def colocated(gpus: int) -> float:
        """VerifyRM resident on the policy's `gpus`, time-sliced with it; the assistant on a GPU of its own."""
        return pipelined((p["rollout"] + p["rm_score"] + p["policy_update"] + p["rm_update"]) * on(gpus),
                         p["negatives"] + p["rm_update"] * on(gpus))

    split = a.gpus - 2
    side_gpu_s = p["rm_score_one_gpu"] + p["negatives"] + p["rm_update_one_gpu"]
    rows = {  # name: (step seconds, GPUs used)
        "rule": (p["rollout"] + p["policy_update"], a.gpus),
        "static": (p["rollout"] + p["rm_score"] + p["policy_update"], a.gpus),
        "cooper-released": (p["rollout"] + p["negatives"] + p["rm_offload"] + p["rm_score"] + p["rm_update"]
                            + p["policy_update"], a.gpus + 1),
        "cooper-overlapped": (pipelined(p["rollout"] + p["rm_offload"] + p["rm_score"] + p["rm_update"]
                                        + p["policy_update"], p["negatives"] + p["rm_offload"] + p["rm_update"]),
                              a.gpus + 1),
        "cooper-colocated": (colocated(a.gpus), a.gpus + 1),
        "cooper-colocated-same-gpus": (colocated(a.gpus - 1), a.gpus),
        # scoring on VerifyRM's one GPU gates the policy's update; its update and the negatives have GPUs of their own
        "cooper-split": (pipelined((p["rollout"] + p["policy_update"]) * on(split) + p["rm_score_one_gpu"],
                                   p["negatives"] + p["rm_update_one_gpu"]), a.gpus),
        "cooper-side-gpu": (max((p["rollout"] + p["policy_update"]) * on(a.gpus - 1) + p["rm_score_one_gpu"],
                                side_gpu_s), a.gpus),
        "cooper-colocated-unsharded": (pipelined(p["rollout"] + p["policy_update"] + p["rm_score_one_gpu"]
                                                 + p["rm_update_one_gpu"], p["negatives"] + p["rm_update_one_gpu"]),
                                       a.gpus + 1),
    }
    memory = memory_per_gpu(a)
    rule = rows["rule"][0]
    return {name: {"step_s": round(step, 2), "vs_rule": round(step / rule, 3), "gpus": gpus, **memory[name]}
            for name, (step, gpus) in rows.items()}


def memory_per_gpu(a: Assumptions) -> dict[str, dict[str, float]]:
    """GB per GPU of model state (weights, gradients, optimizer, frozen copies), and what is left for the KV cache:
    on the policy's GPUs, or on the busiest GPU where one holds more (the layouts with VerifyRM on one device)."""
    gb = 1e9
    policy = a.policy_params * a.bytes_per_param_trained / gb
    reference = a.policy_params * a.bytes_per_param_frozen / gb
    rollout_copy = a.policy_params * a.bytes_per_param_frozen / gb  # vLLM's own weights
    rm_trained = a.rm_params * a.bytes_per_param_trained / gb
    rm_frozen = a.rm_params * a.bytes_per_param_frozen / gb
    shared = (policy + reference) / a.gpus + rollout_copy
    out = {
        "rule": shared,
        "static": shared + rm_frozen / a.gpus,
        "cooper-released": shared + rm_frozen / a.gpus,  # the rest of VerifyRM's state waits on the host
        "cooper-overlapped": shared + rm_frozen / a.gpus,
        "cooper-colocated": shared + rm_trained / a.gpus,
        "cooper-colocated-same-gpus": (policy + reference + rm_trained) / (a.gpus - 1) + rollout_copy,
        "cooper-split": (policy + reference) / (a.gpus - 2) + rollout_copy,  # the policy's GPUs
        # the GPU VerifyRM shares: with the assistant's weights; with a policy rank's share
        "cooper-side-gpu": rm_trained + a.assistant_params * a.bytes_per_param_frozen / gb,
        "cooper-colocated-unsharded": shared + rm_trained,
    }
    return {name: {"state_gb_per_gpu": round(used, 1), "kv_cache_gb_per_gpu": round(a.gpu_memory_gb - used, 1)}
            for name, used in out.items()}


def main() -> None:
    defaults = Assumptions()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for field, value in asdict(defaults).items():
        flag = "--" + field.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"(default {value})")
    args = parser.parse_args()
    assumptions = Assumptions(**{field: getattr(args, field) for field in asdict(defaults)})
    if assumptions.gpus < 3:
        parser.error("--gpus must be at least 3: the split layout gives VerifyRM and the assistant one GPU each")
    result = layouts(assumptions)
    for name, row in result.items():
        print(f"{name:27s} {row['step_s']:7.2f} s  x{row['vs_rule']:.3f} of rule on {assumptions.gpus}  "
              f"{row['gpus']} GPUs  {row['state_gb_per_gpu']:5.1f} GB of model state per GPU")
    print(json.dumps({"bench": "cost_model", "estimates": True, "assumptions": asdict(assumptions),
                      "parts_s": {k: round(v, 3) for k, v in parts(assumptions).items()}, "layouts": result}))


if __name__ == "__main__":
    main()
