"""One KV block as a file: a checksummed header, the block's tokens, its KV bytes.

    magic | fingerprint | group | block hash | tokens | payload bytes | BLAKE2b
    then the tokens (int64 each) and the payload

The checksum covers the header's other fields, the tokens and the payload, so a file
that was torn, truncated, corrupted or written for another model (another fingerprint,
group or hash than the name promises) is refused before a byte of it is used as KV.
A write goes to a temporary file in the same folder, is fsynced and then renamed: a
writer killed mid-write leaves a temporary file, never an entry.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
from array import array
from pathlib import Path

from hetero_infer.engine.kv.disk_layout import TEMP_PREFIX

MAGIC = b"HPIKV\x00\x01\x00"  # format version in the last bytes
# magic, fingerprint (16 bytes), group, block hash, tokens, payload bytes
_FIELDS = struct.Struct("<8s16sIQIQ")
# The header keeps a hash's low 64 bits: sha256_cbor's are 256 (the file's name holds
# the whole hash, and its tokens are compared on every read).
_HASH_MASK = (1 << 64) - 1
_DIGEST_BYTES = 16
HEADER_BYTES = _FIELDS.size + _DIGEST_BYTES


class CorruptBlockFile(Exception):
    """A file that is not a whole block of the KV asked for."""


def _fingerprint_bytes(fingerprint: str) -> bytes:
    return bytes.fromhex(fingerprint)[:16].ljust(16, b"\0")


def _header_fields(
    fingerprint: str, group: int, block_hash: int, num_tokens: int, payload_bytes: int
) -> bytes:
    fingerprint_bytes, hash_bits = _fingerprint_bytes(fingerprint), block_hash & _HASH_MASK
    return _FIELDS.pack(MAGIC, fingerprint_bytes, group, hash_bits, num_tokens, payload_bytes)


def file_bytes(num_tokens: int, payload_bytes: int) -> int:
    return HEADER_BYTES + 8 * num_tokens + payload_bytes


def write_block(
    path: Path,
    fingerprint: str,
    group: int,
    block_hash: int,
    token_ids: tuple[int, ...],
    payload: memoryview,
) -> None:
    """Write the block atomically (temporary file, fsync, rename); OSError on failure,
    with nothing left behind but, if the process dies, a temporary file."""
    tokens = array("q", token_ids).tobytes()
    fields = _header_fields(fingerprint, group, block_hash, len(token_ids), payload.nbytes)
    digest = hashlib.blake2b(fields, digest_size=_DIGEST_BYTES)
    digest.update(tokens)
    digest.update(payload)
    temp = path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temp, "wb") as f:
            f.write(fields)
            f.write(digest.digest())
            f.write(tokens)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def read_block(
    path: Path,
    fingerprint: str,
    group: int,
    block_hash: int,
    token_ids: tuple[int, ...],
    into: memoryview,
) -> None:
    """Read the block's KV into ``into`` (its exact size), checked whole against the
    header, the tokens and the checksum; CorruptBlockFile if anything is off (``into``
    then holds garbage the caller must not use), FileNotFoundError if it is gone."""
    expected = _header_fields(fingerprint, group, block_hash, len(token_ids), into.nbytes)
    tokens = array("q", token_ids).tobytes()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != file_bytes(len(token_ids), into.nbytes):
            raise CorruptBlockFile(f"{path.name}: {size} bytes, not a whole block")
        header = f.read(HEADER_BYTES)
        if header[: _FIELDS.size] != expected:
            raise CorruptBlockFile(f"{path.name}: another model's, group's or block's KV")
        if f.read(len(tokens)) != tokens:
            raise CorruptBlockFile(f"{path.name}: other tokens (a hash collision)")
        if f.readinto(into) != into.nbytes:
            raise CorruptBlockFile(f"{path.name}: truncated while read")
    digest = hashlib.blake2b(expected, digest_size=_DIGEST_BYTES)
    digest.update(tokens)
    digest.update(into)
    if digest.digest() != header[_FIELDS.size :]:
        raise CorruptBlockFile(f"{path.name}: checksum mismatch")
