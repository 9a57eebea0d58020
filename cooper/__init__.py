"""Cooper: GRPO with a reward model that is trained alongside the policy."""

__version__ = "0.1.0"
