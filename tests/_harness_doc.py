"""The example harness of docs/register_harness.md, registered once per test process by running the doc's code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "register_harness.md"
_NS: dict[str, Any] = {}


def register_doc_harness() -> dict[str, Any]:
    """Run the doc's one Python block (it registers ``tiny``); returns its namespace."""
    if not _NS:
        code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
        assert len(code) == 1, f"{DOC} must hold exactly one python block"
        exec(compile(code[0], str(DOC), "exec"), _NS)
    return _NS
