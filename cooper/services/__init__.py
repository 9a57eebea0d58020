"""The four services: verifier, reward, policy, generator. Each has a pure core and a thin server.py."""
