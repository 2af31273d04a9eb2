"""The engine's entry points: LLMEngine (offline, one thread) and AsyncEngine (the
server's, on a thread of its own), the Rust seed's InferenceEngine, beam search above
them, how the core is built, what a caller gets back (outputs, metrics), and what an
entry point applies to its process."""
