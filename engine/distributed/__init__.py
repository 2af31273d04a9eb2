"""Tensor parallelism over torch.distributed: the model's heads, MLP columns and
vocabulary split over ranks, each rank holding its share of the KV cache. Rank 0 runs
the engine (scheduler, sampler, front end); the other ranks run only the model, on
the step inputs rank 0 broadcasts (worker.py)."""
