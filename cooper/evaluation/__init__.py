"""Evaluation kits: VerifyRM and the rule verifier on a labelled benchmark (rm_bench.py)."""
