"""Speculative decoding: guess a few tokens cheaply, let the model check them in one step.

A decode step at a small batch reads every weight once whether it scores one token or
several, so verifying k guessed tokens costs little more than computing one. Files:
config.py (the --speculative-config JSON), ngram_proposer.py (guesses from earlier
text), draft_source.py (a draft model, checked against the target), draft_length.py
(how many to guess, from recent acceptance), speculator.py (which sequences get
drafts, for the scheduler), verifier.py (the sampler's rows for the drafted positions,
and which drafts stand), rejection.py (rejection sampling of a draft model's tokens),
stats.py (vLLM's counters). The draft model itself runs in worker/draft_runner.py.
"""
