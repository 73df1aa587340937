"""Code that snapcoord ships inside itself rather than install under a
top-level name of its own: the generated ``buf.validate`` module, which
``snapcoord.v1`` imports for its validation annotations."""
