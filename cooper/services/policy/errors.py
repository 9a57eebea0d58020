"""The policy service's failures of its training ranks (world_size > 1), raised by `ranks/`, handled by
`core.py` and answered by `server.py`."""


class RankFailure(RuntimeError):
    """A training rank died or failed (world_size > 1); its shard of the weights and optimizer is lost."""


class RanksRestarted(RuntimeError):
    """The call failed because a rank failed, and the service has started its ranks again from the latest
    checkpoint: the update was not applied, and a retry will be. Servers answer it with UNAVAILABLE."""


class GroupLost(RuntimeError):
    """The call failed because a rank of a group that a launcher started on several machines failed: the update was
    not applied, and the service stops (exit 1) so that the launcher starts every rank again, from the latest
    checkpoint plus the update journal. Servers answer it with UNAVAILABLE; clients retry until the group is back."""


class NotOffered(RuntimeError):
    """An operation the policy service does not offer as it runs (launched across machines, or with rollouts ahead of
    training); servers answer FAILED_PRECONDITION."""


class VersionNotHeld(RuntimeError):
    """Generate asked for a policy version the service does not hold (neither its current one nor, with
    run.max_staleness, one of the versions it keeps behind it); servers answer FAILED_PRECONDITION."""


class StaleRollout(RuntimeError):
    """Train got a rollout it must not train on as it stands: sampled more than run.max_staleness versions behind
    the trainer, by a version the trainer has not made yet, or behind the trainer without the sampling log-probs the
    importance correction needs. Nothing is applied; servers answer FAILED_PRECONDITION."""
