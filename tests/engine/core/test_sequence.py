"""Sequence's own rules, apart from the scheduler that drives it."""

from __future__ import annotations

import itertools

from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.lora.registry import LoRARequest
from hetero_infer.engine.params.sampling_params import SamplingParams

ADAPTER = LoRARequest(name="adapter", slot=1, fingerprint=0x5A5A_0000_1234, path="unused")


def test_each_kind_of_kv_gets_its_own_salt() -> None:
    """The prefix cache keeps apart blocks of the same tokens that hold other KV (LongRoPE's
    long factors, an adapter's) or another client's (cache_salt): every mix of the three
    salts its first block differently, and only the plain sequence goes unsalted."""
    salts = []
    for cache_salt, lora, long_rope in itertools.product(
        (None, "alice", "bob"), (None, ADAPTER), (False, True)
    ):
        params = SamplingParams(max_tokens=4, cache_salt=cache_salt)
        seq = Sequence("s", [1, 2, 3], params, lora=lora)
        seq.long_rope = long_rope
        salts.append(seq.hash_salt)
        assert seq.hash_salt == seq.hash_salt  # made of the request alone
    assert salts[0] is None
    assert None not in salts[1:] and len(set(salts)) == len(salts)
