"""The engine core: request state, the scheduler, the KV block manager and the one
decision of when a sequence stops. Pure Python: no torch."""
