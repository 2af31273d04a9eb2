"""The worker: the model runner that owns the model and the KV cache, the step's input
tensors, the sampler, and CUDA graphs. It takes the scheduler's plain output and returns
plain results."""
