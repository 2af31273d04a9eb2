"""The documentation: the MkDocs site under docs/ builds in strict mode (no broken link
or anchor between its pages, no page left out of the nav), the README stays a short
front page whose links into docs/ all lead somewhere, and the configuration page's
table has a row for every setting."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from hetero_infer.engine.settings.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
MAX_README_LINES = 300

# [text](target) and <a href="target">, the target up to an optional #anchor.
_LINK = re.compile(r"\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)|href=\"([^\"]+)\"")


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert (tmp_path / "index.html").is_file(), output


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): "
        "move the details to a page under docs/"
    )


def _links(text: str) -> list[str]:
    return [a or b for a, b in _LINK.findall(text)]


def test_the_readme_links_into_docs_lead_to_files() -> None:
    targets = [t for t in _links(README.read_text()) if t.split("#")[0].startswith("docs/")]
    assert targets, "README.md links to no page under docs/"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).is_file()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_setting_has_a_row_in_the_configuration_page() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \|", CONFIGURATION.read_text(), re.MULTILINE))
    fields = [field.name for field in dataclasses.fields(EngineConfig)]
    missing = [name for name in fields if name not in rows]
    assert not missing, f"{CONFIGURATION.name} has no row for {missing}"
    unknown = sorted(rows - set(fields))
    assert not unknown, f"{CONFIGURATION.name} has rows for settings that do not exist: {unknown}"


def test_links_are_found_in_markdown() -> None:
    text = '[a](docs/a.md) [`b`](docs/b.md) [c](docs/c.md#x "title") <a href="docs/d.md">'
    assert _links(text) == ["docs/a.md", "docs/b.md", "docs/c.md#x", "docs/d.md"]
