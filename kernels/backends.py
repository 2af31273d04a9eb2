"""The attention backends an engine can be set to (kernels/selection.py chooses among
them). Torch-free, so that the engine's config can name them before torch loads."""

BACKENDS = ("auto", "torch", "triton")
