"""gRPC contracts (`*.proto`) and their generated stubs, committed so that users need no protoc."""
