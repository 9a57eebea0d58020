"""The generator service: verified hard negatives (assistant rewrites or rule-based perturbation) and an LLM judge."""
