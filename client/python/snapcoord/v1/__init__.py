"""Generated protobuf and gRPC code of the ``snapcoord.v1`` API (``make generate``)."""
