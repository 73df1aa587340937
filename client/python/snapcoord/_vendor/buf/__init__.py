"""Generated code of the buf.validate annotations that ``snapcoord.v1`` imports."""
