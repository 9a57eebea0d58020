"""The policy service's training ranks, on one machine or several: rank 0 serves gRPC and drives, every other rank
follows its commands.

- `control.py`: the command channel over the group's TCPStore, the commands a rank can be asked to run, and the
  spec every rank builds its shard from;
- `follower.py`: a rank other than 0 (joining the group, sharding, running rank 0's commands);
- `local.py`: the ranks a service starts itself on one machine;
- `group.py`: rank 0's side, the updater PolicyCore trains with (`RankGroup`).

One mechanism for one machine and for several:

- several machines: `torchrun ... -m cooper.cli serve policy` on every node (docs/multi-node.md). torchrun gives
  each process RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (`Placement`); global
  rank 0 serves, every other process runs `follow`;
- one machine (`policy.world_size: N`, no launcher): the service is rank 0 and starts ranks 1..N-1 itself
  (`LocalRanks`), each given the environment torchrun would give it and running the same `follow`.

Control: rank 0 names each command in the TCPStore at MASTER_ADDR:MASTER_PORT (`cmd/<n>`); every other rank waits
for it there, then receives its own arguments from rank 0 over a gloo group (a rollout share can exceed the store's
8 MB values), runs the command (its collectives pair up with the other ranks' because every rank runs the same
commands in the same order) and answers in the store (`ack/<n>/<rank>`). Idle ranks wait on the store, not in a
collective, so no process-group timeout fires between calls however long a rollout takes; a store that stops
answering (its host, node 0, gone) ends the rank.

Failure: the collectives run under `policy.distributed.timeout_s`. A rank that dies closes its connections, so its
peers' collectives fail at once; a node that vanishes is noticed when the timeout runs out; a rank that raises reports
its error and exits, so that no peer waits for it. Rank 0 then raises `RankFailure` naming the rank. On one machine
PolicyCore kills the group and starts a new one from the latest checkpoint plus the update journal; across machines
it cannot start processes on other nodes, so the call answers UNAVAILABLE, the service exits non-zero, and the
launcher (torchrun --max-restarts, compose's restart policy, JobSet's failurePolicy) starts the whole group again,
which resumes the same way.

Placement of the shards: one node, or one rank per node, is plain FSDP2 over all ranks; several nodes with several
ranks each is hybrid sharding (a 2-D mesh: shard within a node, replicate across nodes), so the all-gathers of
every forward stay on the node's fast links.
"""
