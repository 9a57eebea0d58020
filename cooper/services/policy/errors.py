"""The policy service's failures of its training ranks (world_size > 1), raised by `ranks.py`, handled by
`core.py` and answered by `server.py`."""


class RankFailure(RuntimeError):
    """A training rank died or failed (world_size > 1); its shard of the weights and optimizer is lost."""


class RanksRestarted(RuntimeError):
    """The call failed because a rank failed, and the service has started its ranks again from the latest
    checkpoint: the update was not applied, and a retry will be. Servers answer it with UNAVAILABLE."""
