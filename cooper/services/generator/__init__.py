"""The generator service: verified hard negatives and an LLM judge.

- `negatives.py`: propose a wrong rewrite of a positive, keep it when the verifier proves it wrong; the proposers:
  `assistant.py` (an LLM), `perturb.py` and `varied.py` (rule-based).
- `judge.py`: the LLM judge of hybrid annotation.
- `server.py`: the gRPC front; `client.py`: its client; `inprocess.py`: Negatives in the caller's process (rule
  strategies); `messages.py`: the dataclasses they speak.
"""
