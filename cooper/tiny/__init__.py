"""The `tiny` preset: a synthetic arithmetic task and tiny Qwen2-architecture models built locally (no hub)."""
