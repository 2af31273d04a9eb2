"""The engine's front end: requests in (validated, tokenized, fanned out for n) and
outputs out (detokenized, stop strings applied, snapshots the engine never changes)."""
