"""The example engine of docs/register_engine.md, registered once per test process by running the doc's code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "register_engine.md"
_NS: dict[str, Any] = {}


def register_doc_engine() -> dict[str, Any]:
    """Run the doc's one Python block (it registers ``torch_sampler``); returns its namespace."""
    if not _NS:
        code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
        assert len(code) == 1, f"{DOC} must hold exactly one python block"
        exec(compile(code[0], str(DOC), "exec"), _NS)
    return _NS
