"""Block hashes and images: a block's hash names the images whose placeholder tokens it
holds, so the same tokens behind another image never share its KV."""

from __future__ import annotations

import pytest
from hetero_infer.engine.core.block_hashing import block_hasher
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.params.sampling_params import SamplingParams

BS = 4
TOKENS = list(range(10, 10 + 4 * BS))


def hashes_with_image(algo: str, content_hash: int, positions: tuple[int, ...]) -> list[int]:
    image = ImageInput(content_hash, pixel_values=None, positions=positions)
    seq = Sequence("s", TOKENS, SamplingParams(max_tokens=1), images=(image,))
    return block_hasher(algo, key=b"k" * 16, seed="0").block_hashes(seq, BS, 4)


@pytest.mark.parametrize("algo", ["keyed", "sha256_cbor"])
@pytest.mark.parametrize("positions", [(1, 2), (5, 6, 7), (6, 7, 8, 9)])
def test_another_image_changes_the_blocks_from_its_first_on(algo, positions):
    """An image within block 0 or block 1, or across blocks 1 and 2: another image at
    the same positions changes the hash of the first block holding it and of every
    block after it (they chain), and of none before."""
    first_block = positions[0] // BS
    one, other = hashes_with_image(algo, 1, positions), hashes_with_image(algo, 2, positions)
    same = [a == b for a, b in zip(one, other, strict=True)]
    assert same == [i < first_block for i in range(4)]
