"""The disk tier under faults: each run ends with the tokens a run without tiers gives,
and nothing held. A file truncated or corrupted, a file of another model, a full disk
and a writer killed mid-write are each detected, skipped (the prefix is recomputed)
and never read as KV; a disk that fills up mid-file and two processes writing one
directory at once leave whole entries only."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from hetero_infer.engine import LLMEngine
from hetero_infer.engine.kv import block_file
from hetero_infer.engine.kv.block_file import file_bytes

from tests.engine.kv.tier_engines import (
    BLOCK_SIZE,
    assert_nothing_leaked,
    block_files,
    bytes_per_slot,
    run_in_turn,
    tier_config,
    tiny_llama_run,
)
from tests.tiny_models import save_tiny_model

MODEL = "llama"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_llama_run(tmp_path_factory, count=4, seed=3)


def fill_disk(folder, batch, expected, directory) -> LLMEngine:
    """An engine whose first prompt's blocks were evicted to the directory."""
    engine = LLMEngine(tier_config(folder, MODEL, ram_slots=64, disk=directory))
    assert run_in_turn(engine, batch) == expected
    return engine


def serve_again(folder, batch, expected, directory) -> dict:
    """A fresh engine on the directory serves the first prompt right; its stats."""
    engine = LLMEngine(tier_config(folder, MODEL, ram_slots=64, disk=directory))
    assert run_in_turn(engine, [batch[0]]) == [expected[0]]
    assert_nothing_leaked(engine)
    return engine.memory_stats()


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_a_damaged_file_is_recomputed(tiny, tmp_path, damage):
    folder, batch, expected = tiny
    fill_disk(folder, batch, expected, tmp_path)
    files = block_files(tmp_path)
    assert files
    for path in files:  # every file: whichever block comes first is refused
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data[-5] ^= 0x40
        path.write_bytes(bytes(data))
    stats = serve_again(folder, batch, expected, tmp_path)
    assert stats["kv_tier_disk_corrupt_files"] >= 1
    assert stats["kv_tier_disk_hits"] == 0


def test_another_models_file_is_never_read(tiny, tmp_path):
    folder, batch, expected = tiny
    other = save_tiny_model(MODEL, tmp_path / "other", seed=1)  # same shapes, other weights
    other_dir = tmp_path / "tiers"
    fill_disk(folder, batch, expected, other_dir)
    ours = {p.name: p for p in block_files(other_dir)}
    our_folder = next(iter(ours.values())).parent.parent
    # The other model's files for the same prompts (the directory's key names them
    # alike), copied over ours.
    other_engine = LLMEngine(tier_config(other, MODEL, ram_slots=64, disk=other_dir))
    run_in_turn(other_engine, batch)
    theirs = [p for p in block_files(other_dir) if p.parent.parent != our_folder]
    assert theirs
    for path in theirs:
        if path.name in ours:
            ours[path.name].write_bytes(path.read_bytes())
    stats = serve_again(folder, batch, expected, other_dir)
    assert stats["kv_tier_disk_corrupt_files"] >= 1


def test_a_full_disk_refuses_writes_and_serving_goes_on(tiny, tmp_path, caplog):
    folder, batch, expected = tiny
    config = tier_config(folder, MODEL, ram_slots=8, disk=tmp_path, kv_offloading_dir_size=1e-9)
    engine = LLMEngine(config)
    with caplog.at_level(logging.WARNING):
        assert run_in_turn(engine, batch + [batch[0]]) == expected + [expected[0]]
    stats = engine.memory_stats()
    assert stats["kv_tier_disk_write_errors"] > 1 and stats["kv_tier_disk_bytes_written"] == 0
    assert len([r for r in caplog.records if "KV disk tier" in r.message]) == 1
    assert not block_files(tmp_path) and not list(tmp_path.rglob(".tmp-*"))
    assert_nothing_leaked(engine)


def test_an_unwritable_directory_refuses_writes(tiny, tmp_path):
    folder, batch, expected = tiny
    engine = LLMEngine(tier_config(folder, MODEL, ram_slots=8, disk=tmp_path))
    layout = engine.runner.kv_cache.tiers.layout
    layout.folder.mkdir(parents=True, exist_ok=True)
    layout.group_folder(0).write_text("")  # a file where the folder should be
    assert run_in_turn(engine, batch + [batch[0]]) == expected + [expected[0]]
    assert engine.memory_stats()["kv_tier_disk_write_errors"] > 0
    assert_nothing_leaked(engine)


WRITER = """
import os, sys, time
from hetero_infer.engine import LLMEngine
from tests.engine.kv.tier_engines import prompts, run_in_turn, tier_config
from tests.tiny_models import TINY_MODELS

folder, directory = sys.argv[1], sys.argv[2]
engine = LLMEngine(tier_config(folder, "llama", ram_slots=64, disk=directory))

def stuck(fd):
    print("writing", flush=True)
    time.sleep(600)

os.fsync = stuck  # the first block file's data is written, not yet renamed
run_in_turn(engine, prompts(TINY_MODELS["llama"]().vocab_size, seed=3))
"""


def test_a_writer_killed_mid_write_leaves_no_entry(tiny, tmp_path):
    folder, batch, expected = tiny
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(folder), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "writing"
        temps = list(tmp_path.rglob(".tmp-*"))
        assert temps and temps[0].stat().st_size > 0
    finally:
        writer.kill()  # SIGKILL: no cleanup runs
        writer.wait()
    assert not block_files(tmp_path)
    stats = serve_again(folder, batch, expected, tmp_path)
    assert stats["kv_tier_disk_hits"] == 0
    assert list(tmp_path.rglob(".tmp-*")) == temps  # still a temporary file, never an entry


class FillingDisk:
    """Files whose writes fail with ENOSPC, as a filesystem's do, once ``capacity``
    bytes are written across them: the file being written then is cut mid-way."""

    def __init__(self, capacity: int) -> None:
        self.left = capacity

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)  # noqa: SIM115 (the caller closes it)
        if "w" in mode:
            real_write = f.write

            def write(data) -> int:
                size = memoryview(data).nbytes
                if size > self.left:
                    real_write(memoryview(data)[: self.left])
                    self.left = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.left -= size
                return real_write(data)

            f.write = write
        return f


def test_a_disk_that_fills_up_mid_file(tiny, tmp_path, monkeypatch, caplog):
    """Two and a half files' room: the first two blocks written are whole entries, the
    third is cut by ENOSPC and leaves nothing, every later write fails alike (logged
    once); serving goes on, and a restart reads the two entries."""
    folder, batch, expected = tiny
    engine = LLMEngine(tier_config(folder, MODEL, ram_slots=8, disk=tmp_path))
    one_file = file_bytes(BLOCK_SIZE, bytes_per_slot(MODEL))
    monkeypatch.setattr(block_file, "open", FillingDisk(5 * one_file // 2).open, raising=False)
    with caplog.at_level(logging.WARNING):
        assert run_in_turn(engine, batch + [batch[0]]) == expected + [expected[0]]
    monkeypatch.undo()
    assert engine.memory_stats()["kv_tier_disk_write_errors"] > 1
    assert len([r for r in caplog.records if "KV disk tier" in r.message]) == 1
    assert len(block_files(tmp_path)) == 2 and not list(tmp_path.rglob(".tmp-*"))
    assert_nothing_leaked(engine)
    # The first two blocks written were the first prompt's first two.
    assert serve_again(folder, batch, expected, tmp_path)["kv_tier_disk_hits"] == 2


BUSY_WRITER = """
import sys
from hetero_infer.engine import LLMEngine
from tests.engine.kv.tier_engines import prompts, run_in_turn, tier_config
from tests.tiny_models import TINY_MODELS

folder, directory, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
engine = LLMEngine(tier_config(folder, "llama", ram_slots=8, disk=directory))
batch = prompts(TINY_MODELS["llama"]().vocab_size, seed=3)  # the same blocks in both
run_in_turn(engine, batch + prompts(TINY_MODELS["llama"]().vocab_size, seed=seed))
engine.shutdown()
"""


def test_two_processes_write_one_directory_at_once(tiny, tmp_path):
    """Two engines write the same blocks' files (and their own) at the same time: every
    entry is whole, and a third engine is served the shared prompt from them."""
    folder, batch, expected = tiny
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(BUSY_WRITER), str(folder), str(tmp_path), seed]
        )
        for seed in ("10", "11")
    ]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    assert block_files(tmp_path) and not list(tmp_path.rglob(".tmp-*"))
    stats = serve_again(folder, batch, expected, tmp_path)
    assert stats["kv_tier_disk_hits"] > 0 and stats["kv_tier_disk_corrupt_files"] == 0
