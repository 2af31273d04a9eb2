"""The disk tier's files: a block comes back byte for byte, and a file that is torn,
truncated, corrupted or another model's is refused; the directory's hash key is made
once, private, and shared; the size cap is filled exactly and every byte counted; a
full disk refuses writes, logged once; a file that cannot be read is a miss."""

from __future__ import annotations

import logging
import os
import stat

import pytest
from hetero_infer.engine.kv.block_file import CorruptBlockFile, file_bytes, read_block, write_block
from hetero_infer.engine.kv.disk_layout import DiskLayout, load_or_create_key
from hetero_infer.engine.kv.disk_tier import DiskTier

FINGERPRINT = "ab" * 16
TOKENS = (5, 6, 7, 8)
FILE_BYTES = file_bytes(len(TOKENS), 256)  # one block's file, payload() its bytes


def payload(n: int = 256, fill: int = 7) -> memoryview:
    return memoryview(bytearray((fill + i) % 256 for i in range(n)))


def written(tmp_path, block_hash: int = 42):
    path = tmp_path / "block.kv"
    write_block(path, FINGERPRINT, 0, block_hash, TOKENS, payload())
    return path


def test_a_block_comes_back_byte_for_byte(tmp_path):
    path = written(tmp_path)
    into = memoryview(bytearray(256))
    read_block(path, FINGERPRINT, 0, 42, TOKENS, into)
    assert bytes(into) == bytes(payload())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_sha256_cbor_hash_of_256_bits_writes_and_reads_back(tmp_path):
    """vLLM's hashes are 256 bits: the header keeps their low 64 (the name, the whole)."""
    wide = (0xABCD << 200) | (1 << 64) | 42
    path = written(tmp_path, wide)
    into = memoryview(bytearray(256))
    read_block(path, FINGERPRINT, 0, wide, TOKENS, into)
    assert bytes(into) == bytes(payload())
    with pytest.raises(CorruptBlockFile):
        read_block(path, FINGERPRINT, 0, wide + 1, TOKENS, into)


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip_payload", "flip_header", "trailing"],
)
def test_a_damaged_file_is_refused(tmp_path, damage):
    path = written(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "flip_payload":
        data[-1] ^= 0xFF
    elif damage == "flip_header":
        data[30] ^= 0x01
    else:
        data += b"\0"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlockFile):
        read_block(path, FINGERPRINT, 0, 42, TOKENS, memoryview(bytearray(256)))


@pytest.mark.parametrize(
    ("fingerprint", "group", "block_hash", "tokens"),
    [
        ("cd" * 16, 0, 42, TOKENS),
        (FINGERPRINT, 1, 42, TOKENS),
        (FINGERPRINT, 0, 43, TOKENS),
        (FINGERPRINT, 0, 42, (5, 6, 7, 9)),
    ],
)
def test_another_models_group_hash_or_tokens_is_refused(
    tmp_path, fingerprint, group, block_hash, tokens
):
    path = written(tmp_path)
    with pytest.raises(CorruptBlockFile):
        read_block(path, fingerprint, group, block_hash, tokens, memoryview(bytearray(256)))


def test_the_hash_key_is_made_once_private_and_shared(tmp_path):
    first = load_or_create_key(tmp_path / "new" / "tier")
    assert load_or_create_key(tmp_path / "new" / "tier") == first
    mode = stat.S_IMODE(os.stat(tmp_path / "new" / "tier" / "hash_key").st_mode)
    assert mode == 0o600
    assert len(first) == 16 and load_or_create_key(tmp_path / "other") != first


def test_the_cap_evicts_the_least_recently_used_down_to_nine_tenths(tmp_path):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=3 * FILE_BYTES)
    kept = []
    for h in range(6):
        assert tier.write(0, h, TOKENS, payload())
        os.utime(layout.path(0, h), (h, h))  # written in order
        kept.append([k for k in range(h + 1) if layout.exists(0, k)])
    # Past the cap, 90% of three blocks less the new one leaves room for one more.
    assert kept == [[0], [0, 1], [0, 1, 2], [2, 3], [2, 3, 4], [4, 5]]
    assert tier.used == 2 * FILE_BYTES


def test_a_file_read_is_evicted_last(tmp_path):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=3 * FILE_BYTES)
    for h in range(3):
        assert tier.write(0, h, TOKENS, payload())
        os.utime(layout.path(0, h), (h, h))
    assert tier.read(0, 0, TOKENS, memoryview(bytearray(256)))
    assert tier.write(0, 3, TOKENS, payload())
    assert [k for k in range(4) if layout.exists(0, k)] == [0, 3]


def test_stale_temporary_files_are_removed_at_start(tmp_path):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    layout.folder.mkdir(parents=True)
    stale, live = layout.folder / ".tmp-dead", layout.folder / ".tmp-live"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")  # a live writer's: renamed within a step
    os.utime(stale, (0, 0))
    DiskTier(layout, capacity_bytes=10**6)
    assert not stale.exists() and live.exists()


def test_the_cap_is_filled_exactly_and_every_byte_counted(tmp_path):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=2 * FILE_BYTES)
    assert tier.write(0, 1, TOKENS, payload()) and tier.write(0, 2, TOKENS, payload())
    assert layout.exists(0, 1) and layout.exists(0, 2)  # two blocks fill the cap exactly
    assert tier.used == tier.counters.bytes_written == 2 * layout.path(0, 1).stat().st_size
    assert tier.read(0, 2, TOKENS, memoryview(bytearray(256)))
    assert tier.counters.bytes_read == FILE_BYTES
    # A cap of one block: each write evicts the one before.
    one = DiskTier(DiskLayout(tmp_path / "one", FINGERPRINT), capacity_bytes=FILE_BYTES)
    assert one.write(0, 1, TOKENS, payload()) and one.write(0, 2, TOKENS, payload())
    assert not one.layout.exists(0, 1) and one.layout.exists(0, 2)
    assert (one.used, one.counters.bytes_written) == (FILE_BYTES, 2 * FILE_BYTES)
    assert DiskTier(one.layout, capacity_bytes=FILE_BYTES).used == FILE_BYTES  # counted at start


def test_files_written_and_removed_are_recorded_only_while_events_are_on(tmp_path):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=FILE_BYTES)
    assert tier.write(0, 1, TOKENS, payload())
    assert tier.changes.take() == []
    tier.changes.recording = True
    assert tier.write(0, 2, TOKENS, payload())  # evicts the first
    assert tier.changes.take() == [(0, 1, None), (0, 2, TOKENS)]


def test_a_file_that_cannot_be_read_is_a_miss(tmp_path, caplog):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=10**6)
    layout.path(0, 5).mkdir(parents=True)  # a folder where the file should be
    with caplog.at_level(logging.WARNING):
        assert not tier.read(0, 5, TOKENS, memoryview(bytearray(256)))
        assert not tier.read(0, 5, TOKENS, memoryview(bytearray(256)))
    assert len([r for r in caplog.records if "KV disk tier" in r.message]) == 1
    assert tier.counters.write_errors == tier.counters.bytes_read == 0


def test_a_full_disk_refuses_writes_and_says_so_once(tmp_path, caplog):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=10)  # under one block
    with caplog.at_level(logging.WARNING):
        assert not tier.write(0, 1, TOKENS, payload())
        assert not tier.write(0, 2, TOKENS, payload())
    assert tier.counters.write_errors == 2
    assert len([r for r in caplog.records if "KV disk tier" in r.message]) == 1
    # A folder that cannot be written (a file where the group's folder should be).
    layout.folder.mkdir(parents=True)
    layout.group_folder(0).write_text("")
    tier = DiskTier(layout, capacity_bytes=10**6)
    assert not tier.write(0, 3, TOKENS, payload())
    assert not list(layout.folder.rglob(".tmp-*"))


def test_a_corrupt_file_is_counted_and_removed(tmp_path):
    layout = DiskLayout(tmp_path, FINGERPRINT)
    tier = DiskTier(layout, capacity_bytes=10**6)
    assert tier.write(0, 9, TOKENS, payload())
    path = layout.path(0, 9)
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    assert not tier.read(0, 9, TOKENS, memoryview(bytearray(256)))
    assert tier.counters.corrupt_files == 1 and not path.exists()
    assert not tier.read(0, 9, TOKENS, memoryview(bytearray(256)))  # gone: a miss
