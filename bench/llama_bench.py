"""llama.cpp's own ``llama-bench`` on a GGUF: the peer's decode speed with no server
around it, run beside the serving benchmarks once a round (bench/peers.py,
bench/single_stream.py) so that a result file says how fast llama.cpp itself was on
the machine at the time.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from bench import peers

TIMEOUT = 900.0

# llama-bench's markdown rows: | model | size | params | backend | threads | test | t/s |
_BENCH_ROW = re.compile(r"^\|.*\|\s*((?:pp|tg)\d+)\s*\|\s*([\d.]+)\s*±\s*([\d.]+)\s*\|\s*$")


def parse(text: str) -> dict[str, dict[str, float]]:
    """{"pp64": {"tok_s": ..., "std": ...}, "tg128": {...}} from llama-bench's table."""
    tests = {}
    for line in text.splitlines():
        match = _BENCH_ROW.match(line.strip())
        if match:
            tests[match[1]] = {"tok_s": float(match[2]), "std": float(match[3])}
    return tests


def run(gguf: Path, threads: int, prompt_len: int, output_len: int) -> dict[str, Any]:
    """``llama-bench -m FILE -t THREADS -p PROMPT_LEN -n OUTPUT_LEN``, as it printed."""
    try:
        binary = peers.llama_server_binary("llama-bench")
    except peers.Skip as exc:
        return {"skipped": f"skipped: {exc}"}
    command = [
        str(binary), "-m", str(gguf), "-t", str(threads),
        "-p", str(prompt_len), "-n", str(output_len),
    ]  # fmt: skip
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"command": command, "error": f"timed out after {TIMEOUT:.0f} s"}
    record: dict[str, Any] = {
        "command": command,
        "build": peers.llama_server_build(),
        "returncode": proc.returncode,
        "output": proc.stdout,
        "tests": parse(proc.stdout),
    }
    if proc.returncode != 0:
        record["error"] = f"exit status {proc.returncode}: {proc.stderr.strip()[-500:]}"
    return record


def tg(record: dict[str, Any], output_len: int) -> float | None:
    """The run's tg tokens/s, None where it did not run."""
    test = record.get("tests", {}).get(f"tg{output_len}")
    return test["tok_s"] if test else None
