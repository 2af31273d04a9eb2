"""One JSON document on one line, as the streams send them (SSE ``data:`` lines, NDJSON).

JSON may carry U+0085, U+2028 and U+2029 raw, and a line of SSE or NDJSON ends only at
CR or LF; but clients that split a stream with Python's ``str.splitlines`` (httpx's
``aiter_lines`` among them) end a line at each of the three too, and then cannot parse
either half. A model's text can hold them, so they are sent escaped: the same JSON
once parsed.
"""

from __future__ import annotations

import json
from typing import Any

_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(value: Any) -> str:
    """``value`` as JSON, UTF-8 kept, with no character a client may take for the end
    of a line."""
    return json.dumps(value, ensure_ascii=False).translate(_LINE_BREAKS)
