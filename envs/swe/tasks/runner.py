"""A long-lived builder container on a repo image: write files, run pytest, parse its report, reset the tree."""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from swebench.harness.log_parsers import PARSER_REGISTRY

from sao.sandboxes.docker import tar_one

TEST_FILE_RE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
SKIP_DIRS = ("docs/", "doc/", "examples/", "benchmarks/", "build/")
PYTEST = "python -m pytest -p no:cacheprovider -rA"
FAILING = ("FAILED", "ERROR")


class BuilderContainerError(RuntimeError):
    """The builder's container died or Docker stopped answering."""


@dataclass(frozen=True)
class TestRun:
    exit_code: int
    output: str
    status: dict[str, str]
    seconds: float


def parse_pytest(output: str) -> dict[str, str]:
    """Test id -> status from ``pytest -rA`` output (the official swebench parser). Parametrized ids with spaces
    are dropped: that parser cuts them at the space (they show as ids with an unclosed ``[``)."""
    status = PARSER_REGISTRY["parse_log_pytest"](output, None)
    return {k: v for k, v in status.items() if "::" in k and " " not in k and k.count("[") == k.count("]")}


def failure_excerpts(output: str, limit: int = 3, max_lines: int = 6) -> list[tuple[str, list[str]]]:
    """(section title, ``E`` lines) of the first failures in ``pytest --tb=short`` output: the error messages,
    never the source lines pytest prints around them."""
    sections: list[tuple[str, list[str]]] = []
    current: tuple[str, list[str]] | None = None
    for line in output.splitlines():
        m = re.match(r"^_{3,} (.+?) _{3,}$", line)
        if m:
            current = (m.group(1), [])
            sections.append(current)
        elif current is not None and line.startswith("E ") and len(current[1]) < max_lines:
            current[1].append(line[:300])
        elif line.startswith("=") and "short test summary" in line:
            break
    return [s for s in sections if s[1]][:limit]


class BuilderContainer:
    """One container (no network) used serially by one worker thread."""

    def __init__(self, client: Any, image: str, mem_limit: str = "2g") -> None:
        self.image = image
        try:
            self.container = client.containers.run(
                image,
                detach=True,
                network_mode="none",
                mem_limit=mem_limit,
                working_dir="/testbed",
                labels={"sao.owner_pid": str(os.getpid()), "sao.role": "swe-task-builder"},
                environment={"COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1"},
            )
        except Exception as e:
            raise BuilderContainerError(f"could not start a container from {image}: {e}") from e

    def sh(self, cmd: str, timeout: float = 120) -> tuple[int, str]:
        wrapped = f"timeout -k 5 {int(timeout)} bash -c {shlex.quote(cmd)}"
        try:
            res = self.container.exec_run(["bash", "-c", wrapped], workdir="/testbed")
        except Exception as e:
            raise BuilderContainerError(f"exec in {self.container.short_id} failed: {e}") from e
        return int(res.exit_code), res.output.decode(errors="replace")

    def check(self, cmd: str, timeout: float = 60) -> str:
        code, out = self.sh(cmd, timeout)
        if code != 0:
            raise BuilderContainerError(f"`{cmd}` exited {code} in the builder container:\n{out[-1500:]}")
        return out

    def write(self, path: str, text: str) -> None:
        archive = tar_one(os.path.basename(path), text.encode())
        dest = os.path.join("/testbed", os.path.dirname(path))
        if not self.container.put_archive(dest, archive):
            raise BuilderContainerError(f"could not write {path} into the builder container")

    def read(self, path: str) -> str:
        return self.check(f"cat {shlex.quote(path)}")

    def reset(self) -> None:
        self.check("git checkout -q -- . && git clean -fdq")

    def pytest(self, files: list[str], extra: str = "", timeout: float = 120) -> TestRun:
        t0 = time.monotonic()
        code, out = self.sh(f"{PYTEST} {extra} {' '.join(shlex.quote(f) for f in files)}", timeout)
        return TestRun(code, out, parse_pytest(out), time.monotonic() - t0)

    def tracked_python_files(self) -> tuple[list[str], list[str]]:
        """(source files, test files) tracked in the repo."""
        names = self.check("git ls-files '*.py'").split()
        names = [n for n in names if not n.startswith(SKIP_DIRS)]
        tests = [n for n in names if TEST_FILE_RE.search(n)]
        sources = [
            n
            for n in names
            if n not in tests
            and "/tests/" not in f"/{n}"
            and "/test/" not in f"/{n}"
            and os.path.basename(n) not in ("setup.py", "conftest.py", "noxfile.py")
        ]
        return sources, tests

    def close(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception:
            pass
