"""Tensor parallelism's communication over torch.distributed: the ranks' process group
and collectives (process_group.py) and rank 0's step commands as tensors
(step_broadcast.py). The runner (worker/) uses them; the ranks are started by
engine/executor/, and the checkpoint's split is the model's (models/sharding.py)."""
