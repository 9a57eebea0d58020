"""The policy service's failures of its training ranks (world_size > 1), raised by `ranks.py`, handled by
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


class NotAcrossMachines(RuntimeError):
    """An operation a policy launched across machines does not offer yet; servers answer FAILED_PRECONDITION."""
