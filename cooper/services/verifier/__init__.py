"""The rule verifier: math-verify in killable worker processes behind gRPC."""
