"""One rank's share of a policy update under FSDP2 (`fully_shard`): the sharded model, the batch split, the
global token-mean, and the weights and optimizer state gathered into the single-rank formats.

Every rank runs the single-rank loop (`GRPOTrainer.run_update`) on its own share of the batch (`RankBatch`);
`RankTrainer` only makes its collectives real. `ranks/` starts the processes and tells them what to run. What
keeps the update equal to the single-rank one:

- the advantages are computed by rank 0 over the whole rollout (groups may straddle two ranks' shares);
- the token count of the whole batch is all-reduced before any loss is formed, and each rank divides its loss
  *sums* by it, exactly as the single-rank trainer divides each micro-batch; FSDP's gradient reduction then sums
  (divide factor 1) instead of averaging, so the reduced gradient is the full-batch token-mean gradient;
- the grad norm is the norm of the full (sharded) gradient, so clipping scales every shard alike;
- every rank runs the same number of forward and backward passes (a rank with fewer samples runs masked dummy
  micro-batches), because each pass is a collective that the other ranks wait for.

Left out: tensor/sequence parallelism, sharded (DCP) checkpoints, and meta-device initialisation (each rank reads
the whole model from disk once at start, then keeps only its shard).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from cooper.services.policy.trainer import GRPOTrainer, RolloutSample


@dataclass
class RankBatch:
    """One rank's share of an update: consecutive samples of the rollout and their (global) advantages."""

    samples: list[RolloutSample]
    advantages: list[float]  # one per sample, from the whole rollout's groups
    micro_batches: int  # the same on every rank: each forward/backward is a collective


def split_batch(samples: Sequence[RolloutSample], advantages: Tensor, world_size: int, micro_batch_size: int
                ) -> list[RankBatch]:
    """Cut the rollout into `world_size` consecutive shares whose sizes differ by at most one.

    Any split gives the same update (the loss is a sum over tokens); consecutive shares keep a prompt's group
    mostly on one rank, and equal sizes keep the ranks equally busy.
    """
    base, extra = divmod(len(samples), world_size)
    shares, start = [], 0
    for rank in range(world_size):
        end = start + base + (1 if rank < extra else 0)
        shares.append((start, end))
        start = end
    micro = max(1, max(math.ceil((b - a) / micro_batch_size) for a, b in shares))
    return [RankBatch(list(samples[a:b]), [float(x) for x in advantages[a:b]], micro) for a, b in shares]


def shard_model(model: Any, mp_policy: MixedPrecisionPolicy | None, mesh: DeviceMesh) -> Any:
    """FSDP2 in place: one unit per transformer block (the model's `_no_split_modules`), then the root, which
    holds the embeddings and the head (tied or not) so that shared weights stay in one unit."""
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for module in list(model.modules()):
        if type(module).__name__ in block_names:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    if any(p.requires_grad for p in model.parameters()):
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # Sum, not average, over ranks: each rank's loss is already divided by the global token count.
                # Plain SUM reductions, which every backend has (gloo lacks NCCL's PREMUL_SUM).
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
    return model


def gather_weights(model: Any, into: Any | None) -> None:
    """Collective: every rank gathers each full parameter in turn; rank 0 copies it into `into` (its unsharded
    rollout copy), the other ranks pass None and drop it. One parameter at a time, so no rank holds a full copy."""
    target = dict(into.named_parameters()) if into is not None else {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if into is not None:
                target[name].copy_(full.to(target[name].device, target[name].dtype))
            del full


class RankTrainer(GRPOTrainer):
    """`GRPOTrainer` on a `shard_model` model: the same loop (`run_update`) over one rank's share, with the
    collectives it calls made real."""

    def all_reduce(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def clip_gradients(self, max_norm: float) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):  # a partial norm per rank; the full tensor is the norm of the whole grad
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, norm)
        return float(norm)

    def update(self, part: RankBatch, into: Any | None = None) -> dict[str, float]:
        """Collective: one update over every rank's `part` (`run_update`), then the new weights gathered into rank
        0's rollout model (`into`; None on the other ranks); the whole batch's sums."""
        sums = self.run_update(part.samples, torch.tensor(part.advantages, dtype=torch.float32), part.micro_batches)
        gather_weights(self.model, into)
        return sums

    def full_optimizer_state(self) -> dict[str, Any] | None:
        """Collective: the optimizer state in the single-rank format (`GRPOTrainer.optimizer_state`, full tensors
        on the CPU, parameters by index), on rank 0; None on the others. A checkpoint is therefore the same file
        whatever the world size, and a run can resume on another one."""
        state = self.optimizer.state_dict()
        rank0 = dist.get_rank() == 0
        full: dict[int, dict[str, Any]] = {}
        for index in sorted(state["state"]):
            entry = {}
            for key, value in state["state"][index].items():
                value = value.full_tensor() if isinstance(value, DTensor) else value
                entry[key] = value.detach().cpu() if rank0 else None
            full[index] = entry
        if not rank0:
            return None
        return {"optimizer": {"state": full, "param_groups": state["param_groups"]}, "updates": self.updates}

    def load_full_optimizer_state(self, saved: dict[str, Any]) -> None:
        """Load a single-rank-format optimizer state (as `full_optimizer_state` writes it): each rank keeps its
        shard of every tensor, cut locally from the full one (no communication)."""
        optimizer = saved["optimizer"]
        state: dict[int, dict[str, Any]] = {}
        for index, entry in optimizer["state"].items():
            param = self.params[int(index)]
            state[int(index)] = {
                key: distribute_tensor(value.to(self.device), param.device_mesh, param.placements, src_data_rank=None)
                if isinstance(param, DTensor) and torch.is_tensor(value) and value.shape == param.shape else value
                for key, value in entry.items()
            }
        self.optimizer.load_state_dict({"state": state, "param_groups": optimizer["param_groups"]})
        self.updates = int(saved["updates"])

