"""Cooper's reward model inside trainers other than Cooper's own loop.

- `trl.py`: a reward function for TRL's GRPOTrainer (`reward_funcs`), backed by a reward service in its learning
  mode (reward.learn_online), so that VerifyRM keeps learning from the rollouts it scores.

Standard library only: a trainer's environment needs nothing of Cooper's but this package's source.
"""
