"""What every Cooper service shares: the gRPC server runtime and the client side of it."""
