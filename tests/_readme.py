"""The README's `sao ...` command lines, read the one way both the unit test of its commands and the toy learning
test (which runs the README's toy line) read them."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def sao_lines(text: str) -> list[str]:
    """The `sao ...` commands of the bash blocks (a leading `.venv/bin/` dropped, comments cut)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith(".venv/bin/sao "):
                line = line.removeprefix(".venv/bin/")
            if line.startswith("sao "):
                out.append(line)
    return out


def readme_command(word: str) -> str:
    """The one `sao ...` line of the README that names ``word`` (a config file, say)."""
    found = [line for line in sao_lines(README.read_text(encoding="utf-8")) if word in line.split()]
    assert len(found) == 1, f"the README should have one `sao ...` line naming {word}, has {found}"
    return found[0]
