"""Generated code of ``buf/validate/validate.proto`` (``make generate``)."""
