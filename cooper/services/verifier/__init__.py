"""The rule verifier: math-verify in killable worker processes behind gRPC.

- `rules.py`: the verdict of one pair (pure); `pool.py`: worker processes with a hard per-item timeout.
- `server.py`: the gRPC front; `client.py`: its client; `inprocess.py`: the same calls over a pool the caller owns;
  `messages.py`: the dataclasses they speak.
"""
