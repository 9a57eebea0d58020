"""A rank other than 0: it reads the spec rank 0 publishes, loads and shards the models, joins the process group,
then runs rank 0's commands until told to stop (the package docstring says how it fails)."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from cooper.runtime.checkpoint import OPTIMIZER_FILE
from cooper.runtime.devices import rank_device, resolve_autocast
from cooper.runtime.models import load_causal_lm, resolve_model
from cooper.services.policy.models import load_reference
from cooper.services.policy.placement import Placement
from cooper.services.policy.ranks.control import COMMANDS, Control, RankSpec, exit_if_stuck
from cooper.services.policy.sharded import RankTrainer, shard_model

log = logging.getLogger("cooper.policy")

JOIN_MARGIN_S = 10.0
"""A follower launched on a node exits when rank 0's spec has not come, or it has not joined its process group, this
long after the group's timeout (`follow`), for its launcher to start it again."""

def load_models(spec: RankSpec, device: torch.device) -> tuple[Any, Any | None]:
    """The policy and its reference on the CPU, to be sharded onto `device` (`join_group`)."""
    cpu = torch.device("cpu")
    model = load_causal_lm(spec.weights_path, torch.float32, cpu)
    return model, load_reference(spec.cfg, spec.initial_path, resolve_autocast(spec.cfg.dtype, device), cpu)

def device_mesh(place: Placement, device: torch.device) -> DeviceMesh:
    """FSDP2 over every rank, or, with several nodes of several ranks, hybrid sharding: replicate across nodes
    (dim 0), shard within a node (dim 1)."""
    if place.nodes > 1 and place.local_world_size > 1:
        return init_device_mesh(device.type, (place.nodes, place.local_world_size),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (place.world_size,))

def join_group(spec: RankSpec, place: Placement, control: Control, device: torch.device,
               models: tuple[Any, Any | None], join_limit_s: float | None = None) -> tuple[RankTrainer, Any]:
    """Join the process group (and the gloo group that carries commands' arguments), shard the models onto this
    rank's device, load the optimizer shard. Returns the trainer and the argument group. `join_limit_s`: exit the
    process if joining takes longer (`exit_if_stuck`)."""
    cfg = spec.cfg
    if device.type == "cuda":  # per thread: rank 0 joins on its own rank thread
        torch.cuda.set_device(device)
    backend = cfg.distributed.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=cfg.distributed.timeout_s)
    with exit_if_stuck(join_limit_s, f"policy rank {place.rank}: joining the process group"):
        dist.init_process_group(backend, store=control.process_group_store(), rank=place.rank,
                                world_size=place.world_size, timeout=timeout)
        arguments = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    mesh = device_mesh(place, device)
    autocast = resolve_autocast(cfg.dtype, device)
    # On CUDA the forward runs in bf16 through FSDP's mixed precision (params cast once per all-gather) instead of
    # autocast; the sharded weights, gradients' reduction (by default) and AdamW state stay float32.
    mp_policy = None
    if autocast is not None:
        reduce = torch.float32 if cfg.distributed.reduce_dtype == "float32" else torch.bfloat16
        mp_policy = MixedPrecisionPolicy(param_dtype=autocast, reduce_dtype=reduce)
    model, reference = models
    model = shard_model(model.to(device), mp_policy, mesh)
    if reference is not None:
        reference = shard_model(reference.to(device), None, mesh)
    # autocast_dtype None: FSDP's mixed precision above is what runs the forward in bf16.
    trainer = RankTrainer.from_config(model, reference, cfg, spec.pad_id, None)
    if spec.checkpoint:
        # mmap: each rank touches only the pages of its own shards, not the whole file.
        saved = torch.load(os.path.join(spec.checkpoint, OPTIMIZER_FILE), map_location="cpu", weights_only=True,
                           mmap=True)
        trainer.load_full_optimizer_state(saved)
    return trainer, arguments

def follow(place: Placement, group_timeout_s: float | None) -> int:
    """A rank other than 0: build its shard from the spec rank 0 publishes, then run rank 0's commands until told to
    stop. Returns the exit code (a rank that fails exits at once: see the module docstring). `group_timeout_s` (the
    config's policy.distributed.timeout_s, which the spec brings too): exit if rank 0 has published no spec this long
    plus JOIN_MARGIN_S after this rank met the store (None: wait as long as it takes)."""
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s %(levelname)s policy rank {place.rank}: %(message)s")
    control: Control | None = None
    joined = False  # whether this rank read the spec of the group whose store it met: only then may it report there
    try:
        control = Control(place, timeout_s=600, host=False)
        # Rank 0 publishes the spec once it has loaded its own copy of the model. A node started while node 0 was
        # going away can have its launcher meet node 0's old store and this rank meet the new node 0's, at the same
        # address: that store's rank 0 never comes (its launcher waits for this node's), so this rank exits instead,
        # and its launcher, started again, meets the new store.
        spec_limit_s = None if group_timeout_s is None else group_timeout_s + JOIN_MARGIN_S
        if spec_limit_s is None:
            control.wait_idle("spec")
        elif not control.wait(["spec"], spec_limit_s):
            raise TimeoutError(f"rank 0 published no spec within {spec_limit_s:g} s: the store at "
                               f"{place.master_addr}:{place.master_port} may belong to a group this node's launcher "
                               "did not join")
        spec: RankSpec = control.get("spec")
        joined = True
        # From here a store that stops answering (node 0 gone, its connection left half-open) ends this rank within
        # the group's timeout, as a lost peer does in a collective, not after the start-up wait above.
        control.store.set_timeout(timedelta(seconds=spec.cfg.distributed.timeout_s))
        if spec.cfg.torch_threads:
            torch.set_num_threads(spec.cfg.torch_threads)
        device = rank_device(spec.cfg.device, place.local_rank, "policy.device")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        resolve_model(spec.cfg.model, "causal")  # a model built on the spot (tiny) is built on this node too
        models = load_models(spec, device)
        control.set(f"ack/loaded/{place.rank}", ("ok", None))
        # A node started while node 0 was going away can meet node 0's old store, read the old group's addresses
        # and wait in gloo's connect far longer than the group's timeout (95 s seen, on a 20 s timeout), while the
        # new node 0 waits for it: it exits instead, and its launcher starts it on the new store.
        trainer, arguments = join_group(spec, place, control, device, models,
                                        join_limit_s=spec.cfg.distributed.timeout_s + JOIN_MARGIN_S)
        control.set(f"ack/ready/{place.rank}", ("ok", None))
        for seq in range(1, 2**62):
            control.wait_idle(f"cmd/{seq}")
            command = control.get(f"cmd/{seq}")
            if command == "stop":
                break
            received: list[Any] = [None]
            dist.scatter_object_list(received, None, src=0, group=arguments)
            COMMANDS[command](trainer, *received[0])
            control.set(f"ack/{seq}/{place.rank}", ("ok", None))
        dist.destroy_process_group()
        return 0
    except Exception as err:  # report, then exit at once so that no peer waits for this rank in a collective
        log.exception("failed")
        if control is not None and joined:  # an error key in another group's store would fail that group's start
            try:
                control.set(f"error/{place.rank}", f"{type(err).__name__}: {err}")
            except Exception:  # noqa: BLE001  the store may be what failed
                pass
        logging.shutdown()
        os._exit(1)
