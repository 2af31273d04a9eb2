"""The names the documentation gives (README.md and every page under docs/) exist: each
file of this repository a page names in code, each flag its command lines pass to
`hetero-infer` or to a benchmark, each keyword its Python examples give EngineConfig.
A rename or a removal in the code then fails here, instead of leaving a page that sends
its readers to a file, a flag or a setting that is gone."""

from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import json
import re
import shlex
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from hetero_infer.engine import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# The repository's own paths start with one of its folders or are one of its top-level
# files; such a path must exist as written.
REPO_FOLDERS = ("engine", "server", "kernels", "bench", "tests", "deploy", "docs", ".ci")
TOP_LEVEL_FILES = (
    "pyproject.toml", "setup.py", "Dockerfile", "docker-compose.yml", "config.json",
    "Makefile", "mkdocs.yml", "README.md",
)  # fmt: skip
# A shorter name (`core/block_manager.py`, `csrc/moe_cpu.cpp`, `verifier.py`) is a file's
# when it ends in one of these, or a folder's when its first part is one of our folders'
# names (`overlays/gpu`); some path of ours must end with it.
FILE_SUFFIXES = (
    ".py", ".cpp", ".h", ".cu", ".jinja", ".sh", ".yaml", ".yml", ".json", ".toml", ".md",
    ".html", ".css", ".js",
)  # fmt: skip
# Files of other projects that the pages name, which no path of ours holds.
OTHER_PROJECTS_FILES = {
    "generation_config.json",  # a Hugging Face model folder's sampling defaults
    "adapter_config.json",  # a PEFT adapter folder's settings
    "preprocessor_config.json",  # a vision model folder's image settings (Hub layout)
    "processor_config.json",  # the same, as transformers 5 saves them
}
# Folders that runs write, so a fresh checkout has none.
WRITTEN_BY_RUNS = {
    "bench/results/logs",  # the benchmarks' server logs (in .gitignore)
    "tests/ui/output",  # the chat page's screenshots (tests/ui/conftest.py)
}

# A fenced block, also one indented inside a list item: its info string and body.
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)\n(?P<body>.*?)"
    r"^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
# An inline code span, which may wrap onto the next line.
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# What may follow a file's name in a page: :line, :first-last, ::test_name, #anchor.
_LOCATION = re.compile(r"(?:::[\w.\[\]-]+|:\d+(?:-\d+)?|#[\w-]*)$")
COMMAND_BLOCKS = {"sh", "bash", "shell", "console"}
# Blocks whose words may name files: commands, and layouts (an unlabelled block).
PATH_BLOCKS = COMMAND_BLOCKS | {""}


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body without the list item's indent) of each fenced block."""
    return [(m["info"].strip(), textwrap.dedent(m["body"])) for m in _FENCE.finditer(text)]


def _inline_code(text: str) -> list[str]:
    """The inline code spans outside fenced blocks."""
    return [m[2] for m in _CODE_SPAN.finditer(_FENCE.sub("", text))]


# --- Files ---------------------------------------------------------------------------


def _code_word(word: str) -> str:
    """A word of code without the punctuation of the sentence or list around it."""
    return _LOCATION.sub("", word.strip("()[],;:'\""))


def _path_pattern(word: str) -> str | None:
    """The glob a word of code names a path of ours by (`<placeholder>` as `*`, its
    :line, ::name or #anchor left off), or None when it names none of ours: a URL or
    route, an absolute path, a command, another project's file."""
    word = _code_word(word)
    if not re.fullmatch(r"[\w.*<>/-]+", word) or word.startswith("/"):
        return None
    if word in OTHER_PROJECTS_FILES or word.rstrip("/") in WRITTEN_BY_RUNS:
        return None
    pattern = re.sub(r"<[^<>]*>", "*", word)
    if _is_full_path(pattern) or pattern.endswith(FILE_SUFFIXES):
        return pattern
    first = pattern.split("/")[0]
    return pattern if "/" in pattern and first in _folder_names() else None


def _is_full_path(pattern: str) -> bool:
    return pattern.startswith(tuple(f"{f}/" for f in REPO_FOLDERS)) or pattern in TOP_LEVEL_FILES


@functools.cache
def _repo_paths() -> tuple[str, ...]:
    """Every file and folder of ours (relative, as posix paths), build leftovers aside."""
    paths = [name for name in (*TOP_LEVEL_FILES, *REPO_FOLDERS) if (ROOT / name).exists()]
    for folder in REPO_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if "__pycache__" not in path.parts and path.suffix != ".pyc":
                paths.append(path.relative_to(ROOT).as_posix())
    return tuple(paths)


@functools.cache
def _folder_names() -> frozenset[str]:
    return frozenset(Path(p).name for p in _repo_paths() if (ROOT / p).is_dir())


def _path_exists(pattern: str) -> bool:
    """A full path (or glob) must match as written; a shorter one must end some path."""
    if _is_full_path(pattern):
        return any(ROOT.glob(pattern.rstrip("/")))
    pattern = pattern.rstrip("/")
    return any(fnmatch.fnmatchcase(f"/{path}", f"*/{pattern}") for path in _repo_paths())


def _named_paths(text: str) -> Iterator[tuple[str, str]]:
    """(word, its glob) for each word of the page's code that names a path of ours: in
    its inline code, and its shell and layout blocks (the tree in architecture.md)."""
    codes = _inline_code(text)
    codes += [body for info, body in _fenced_blocks(text) if info in PATH_BLOCKS]
    for code in codes:
        for word in code.split():
            if (pattern := _path_pattern(word)) is not None:
                yield _code_word(word), pattern


def _missing_paths(text: str) -> list[str]:
    return sorted({word for word, pattern in _named_paths(text) if not _path_exists(pattern)})


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_file_a_page_names_exists(page: Path) -> None:
    """A page that names a moved, renamed or removed file sends its reader nowhere."""
    missing = _missing_paths(page.read_text())
    assert not missing, (
        f"{page.relative_to(ROOT)} names files that do not exist: {missing} (a file of "
        "another project, not ours, goes in OTHER_PROJECTS_FILES, saying whose)"
    )


def test_path_names_are_read_as_the_pages_write_them() -> None:
    assert _path_pattern("engine/core/scheduler.py:120") == "engine/core/scheduler.py"
    assert _path_pattern("tests/engine/test_exactness.py::test_greedy") == (
        "tests/engine/test_exactness.py"
    )
    assert _path_pattern("docs/server.md#request-parameters") == "docs/server.md"
    assert _path_pattern("bench/results/gpu-check-<device>.json") == (
        "bench/results/gpu-check-*.json"
    )
    assert _path_pattern("(csrc/moe_cpu.cpp,") == "csrc/moe_cpu.cpp"
    assert _path_pattern("overlays/gpu") == "overlays/gpu"
    for other in ("/v1/chat/completions", "generation_config.json", "nvidia.com/gpu", "--port"):
        assert _path_pattern(other) is None, other
    assert _path_exists("core/block_manager.py") and _path_exists("kernels/*_triton.py")
    assert not _path_exists("core/no_such_module.py")
    assert not _path_exists("engine/no_such_module.py")


# --- Flags ---------------------------------------------------------------------------

# The console script (pyproject.toml's [project.scripts]): its name and its module.
_SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
((SCRIPT, _SCRIPT_TARGET),) = _SCRIPTS.items()
CLI_MODULE = _SCRIPT_TARGET.split(":")[0]
_SEPARATORS = {"|", "||", "&", "&&", ";", "(", ")"}


def _image_entrypoint() -> list[str]:
    """The image's ENTRYPOINT (`docker run IMAGE ARGS` runs it with ARGS after it)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    found = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", dockerfile, re.MULTILINE)
    assert found, "Dockerfile has no ENTRYPOINT in JSON form"
    return json.loads(found[1])


def _shell_commands(body: str) -> Iterator[list[str]]:
    """Each command of a shell block as words: continued lines joined, a console's `$ `
    prompt and comments left off, pipelines and lists split."""
    for line in body.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*\$ ", "", line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            words = list(lexer)
        except ValueError:  # an unclosed quote: output, not a command
            continue
        command: list[str] = []
        for word in [*words, ";"]:
            if word in _SEPARATORS:
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def _invocation(words: list[str]) -> tuple[str, list[str]] | None:
    """(program, its arguments) when the command runs ours: the console script (by any
    path), `-m` the CLI's module (python, torchrun), the image (`docker run`), or
    `-m bench.NAME` (program: the benchmark's module); otherwise None."""
    for i, word in enumerate(words):
        after = words[i + 1 :]
        by_module = i > 0 and words[i - 1] == "-m"
        if words[:2] == ["docker", "run"]:
            if re.fullmatch(rf"{SCRIPT}(:[\w.-]+)?", word):
                entrypoint = _image_entrypoint()
                assert entrypoint[0] == SCRIPT, f"the image runs {entrypoint}, not {SCRIPT}"
                return SCRIPT, entrypoint[1:] + after
        elif word.split("/")[-1] == SCRIPT or (by_module and word == CLI_MODULE):
            return SCRIPT, after
        elif by_module and word.startswith("bench."):
            return word, after
    return None


def _flags(arguments: list[str]) -> list[str]:
    """The options among a command's arguments (`--name=value` as `--name`)."""
    return [a.split("=")[0] for a in arguments if re.match(r"-[A-Za-z-]", a)]


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string the parser takes, its subcommands' included."""
    options: set[str] = set()
    for action in parser._actions:
        options.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                options |= _option_strings(subparser)
    return options


def _cli_options(arguments: list[str]) -> set[str]:
    """The options of the parser the CLI's main hands these arguments to: `serve` first,
    or `--serve` anywhere, picks the server's."""
    cli = importlib.import_module(CLI_MODULE)
    if arguments[:1] == ["serve"] or "--serve" in arguments:
        return _option_strings(cli.build_serve_parser()) | {"--serve"}
    return _option_strings(cli.build_parser()) | {"--serve"}


def _bench_options(module_name: str) -> set[str] | None:
    """The options of a benchmark's parser, from the function that builds it
    (build_parser) or that only parses (parse_args, stopped at its parse and the parser
    taken there). None for a benchmark whose parser is built inside main: getting it
    means running main, so its command lines go unchecked."""
    module = importlib.import_module(module_name)
    if hasattr(module, "build_parser"):
        return _option_strings(module.build_parser())
    if not hasattr(module, "parse_args"):
        return None

    class Built(Exception):
        pass

    def stop(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> NoReturn:
        raise Built(parser)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop)
        try:
            module.parse_args([])
        except Built as built:
            return _option_strings(built.args[0])
    raise AssertionError(f"{module_name}.parse_args builds no parser")


def _unknown_flags(text: str) -> list[str]:
    """`program: --flag` for each flag a command line passes to a program of ours that
    its parser does not take (and `program: no such module` for a missing benchmark)."""
    unknown = []
    for info, body in _fenced_blocks(text):
        if info not in COMMAND_BLOCKS:
            continue
        for words in _shell_commands(body):
            if (invocation := _invocation(words)) is None:
                continue
            program, arguments = invocation
            if program == SCRIPT:
                options = _cli_options(arguments)
            elif importlib.util.find_spec(program) is None:
                unknown.append(f"{program}: no such module")
                continue
            elif (options := _bench_options(program)) is None:
                continue
            unknown += [f"{program}: {f}" for f in _flags(arguments) if f not in options]
    return sorted(set(unknown))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_flag_a_command_line_passes_is_taken(page: Path) -> None:
    """A command copied from a page must run: argparse stops at a flag it does not take."""
    unknown = _unknown_flags(page.read_text())
    assert not unknown, (
        f"{page.relative_to(ROOT)} runs commands with flags or modules that do not exist: {unknown}"
    )


def test_command_lines_are_read_as_a_shell_reads_them() -> None:
    block = textwrap.dedent(
        """\
        .venv/bin/hetero-infer serve --port 8001 \\
          --max-num-seqs=4 &   # a comment --not-a-flag
        torchrun --nproc-per-node 2 -m hetero_infer.server.cli serve --top-k -1
        docker run --rm -p 8000:8000 hetero-infer:cpu --api-key "$(openssl rand -hex 24)"
        curl http://127.0.0.1:8000/v1/models | python -m json.tool --sort-keys
        python -m bench.peers --quick
        """
    )
    runs = [_invocation(words) for words in _shell_commands(block)]
    found = [(run[0], _flags(run[1])) for run in runs if run is not None]
    assert found == [
        (SCRIPT, ["--port", "--max-num-seqs"]),
        (SCRIPT, ["--top-k"]),
        (SCRIPT, ["--api-key"]),
        ("bench.peers", ["--quick"]),
    ]
    assert "--max-num-seqs" in _cli_options(["serve"])
    assert "--input" in _cli_options([]) and "--input" not in _cli_options(["serve"])


# --- Settings ------------------------------------------------------------------------


def _engine_config_keywords(source: str) -> list[str]:
    """The keywords given to EngineConfig(...) and EngineConfig.from_file(...)."""
    keywords = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Attribute) and callee.attr == "from_file":
            callee = callee.value
        name = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
        if name == "EngineConfig":
            keywords += [k.arg for k in node.keywords if k.arg is not None]
    return keywords


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_engine_config_keyword_in_an_example_is_a_setting(page: Path) -> None:
    """Python examples build EngineConfig with the keywords it takes: its fields and the
    seed's names it keeps as InitVars (max_batch_size), so its signature, not its fields."""
    accepted = set(inspect.signature(EngineConfig).parameters)
    unknown = [
        keyword
        for info, body in _fenced_blocks(page.read_text())
        if info in ("python", "py")
        for keyword in _engine_config_keywords(body)
        if keyword not in accepted
    ]
    assert not unknown, f"{page.relative_to(ROOT)} gives EngineConfig unknown settings: {unknown}"


def test_engine_config_keywords_are_found_in_examples() -> None:
    source = (
        "from hetero_infer import engine\n"
        "a = engine.EngineConfig(block_size=16, **extra)\n"
        'b = EngineConfig.from_file("config.json", max_num_seqs=8)\n'
        "c = SamplingParams(max_tokens=4)\n"
    )
    assert _engine_config_keywords(source) == ["block_size", "max_num_seqs"]
