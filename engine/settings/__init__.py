"""The engine's settings: EngineConfig and its checks, the choices they take, the
speculative-decoding settings, the errors the engine raises, and the host memory the
settings give the process."""
