"""What a patch may change before it reaches the SWE grader: source, never the grading machinery. One set of rules for
the training reward (``sao.envs.swe.grading``) and ``sao eval swebench`` (``sao.eval.harness``).

The reward is the verdict of the task's tests run by pytest; a patch that changes what pytest collects, how it is
configured, or what runs when Python starts can earn it without the fix. So before grading, every file a patch
touches (both sides of a rename or copy) is checked, and the whole section of a path that is not source is dropped,
with the path and the reason in the grade's report (``PolicyResult.dropped``):

- ``tests``: a ``tests`` / ``test`` / ``testing`` directory anywhere, ``test_*.py``, ``*_test.py``, ``tests.py``
  (the eval script restores test files anyway; dropping them keeps the graded patch honest about what was fixed).
- ``conftest``: ``conftest.py`` anywhere (pytest imports it before any test: fixtures, hooks, plugins).
- ``test_config``: ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``, ``tox.ini``, ``setup.cfg``,
  ``pyproject.toml`` anywhere: pytest reads options (``addopts = -p plugin``), paths and plugins from them. The whole
  file, not only its test section: the simplest rule that cannot be talked around (a source fix never needs them).
- ``startup_hook``: ``*.pth``, ``sitecustomize.py``, ``usercustomize.py`` (Python runs them at start).
- ``package_metadata``: ``*.egg-info`` / ``*.dist-info`` / ``*.egg-link`` and ``entry_points.txt`` (an installed
  distribution's ``pytest11`` entry point is a plugin pytest loads).
- ``compiled``: ``*.pyc`` / ``*.pyo`` / ``*.so`` / ``*.pyd`` and ``__pycache__`` (not source; an unchecked-hash
  ``.pyc`` or an extension module is imported ahead of the ``.py`` beside it).
- ``new_top_level_module``: a NEW ``name.py`` or ``name/__init__.py`` at the repository root. The eval runs
  ``python -m pytest`` in the repository, whose root is first on ``sys.path``: a new ``pytest.py`` there would be the
  pytest that runs. Judgment call: new modules inside the package's existing directories are source and pass (a fix
  may add a module); a new root-level module is never needed by a fix of an existing package.
- ``git``: ``.git*`` paths (``.gitattributes`` drivers and filters, ``.gitmodules``, ``.git/``).
- ``link``: a symbolic link or submodule entry on either side (not source; a link can point at the tests).
- ``unsafe_path``: absolute paths and ``..``.

Not closed here (library code runs inside the grader's pytest): a source change that monkeypatches pytest, or prints
forged ``PASSED`` lines from the test process, when imported. The reward is only as strong as the test run. A
detector flags it without changing the grade: ``PolicyResult.signals`` lists the kept patch's added lines that
touch pytest, ``sys.modules``, ``atexit``, builtins, forged test verdicts, ``os._exit`` or ``os.fork``
(``report.tamper_signals``).

Parsing follows ``git apply``: a section starts at ``diff --git`` or at a ``---``/``+++`` pair, hunks are consumed by
the line counts of their ``@@`` headers, and lines outside any section are dropped, so ``git apply`` and the harness's
``patch`` fallback see only the sections kept here. Each path is checked as written and with its first component
stripped (``-p1``), so no reading of a header reaches a file the rules refuse. As a backstop, the kept patch is read
by ``git apply --numstat`` itself (this host's git, no repository, no config): if git names a path the rules refuse,
the policy's reading was wrong and nothing of the patch is graded (``misread``).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

TEST_DIRS = frozenset({"tests", "test", "testing"})
TEST_CONFIG = frozenset(
    {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml"}
)
STARTUP_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
METADATA_SUFFIXES = (".egg-info", ".dist-info", ".egg-link")
LINK_MODES = ("120000", "160000")
REASONS = {
    "tests": "a test file (the eval script restores the tests; a fix changes source)",
    "conftest": "conftest.py: pytest imports it before any test (fixtures, hooks, plugins)",
    "test_config": "test-runner configuration: pytest/tox read options, plugins and paths from it",
    "startup_hook": "runs when Python starts (.pth, sitecustomize, usercustomize)",
    "package_metadata": "installed-package metadata: its entry points can register pytest plugins",
    "compiled": "compiled code, not source (imported ahead of the .py beside it)",
    "new_top_level_module": "a new module at the repository root, importable ahead of installed packages (pytest)",
    "git": "git metadata (.gitattributes drivers and filters, .gitmodules, .git/)",
    "link": "a symbolic link or submodule, not source",
    "unsafe_path": "an absolute path or one with '..'",
    "misread": "git apply reads a path here that the policy's own reading did not: nothing of the patch is graded",
}
_SIGNALS = re.compile(
    r"\b_?pytest\b|sys\.modules\s*\[|\batexit\b|\b__builtins__\b|\bimport builtins\b|\bbuiltins\.|"
    r"\b(?:PASSED|FAILED|XPASS|XFAIL)\b|\bos\._exit\b|\bos\.fork\b"
)
MAX_SIGNALS = 10
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_QUOTED_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}
_GIT_HEADERS = (
    "old mode ", "new mode ", "deleted file mode ", "new file mode ", "copy from ", "copy to ", "rename from ",
    "rename to ", "similarity index ", "dissimilarity index ", "index ", "--- ", "+++ ", "Binary files ",
    "GIT binary patch",
)  # fmt: skip


@dataclass(frozen=True)
class Dropped:
    """One path of a patch the grader does not see, and why (``kind`` is a key of ``REASONS``)."""

    path: str
    kind: str

    @property
    def reason(self) -> str:
        return REASONS[self.kind]


@dataclass(frozen=True)
class PolicyResult:
    """``patch``: the sections of the input that may reach the grader, in order; ``dropped``: the refused paths."""

    patch: str
    dropped: tuple[Dropped, ...] = ()
    sections: int = 0
    signals: tuple[str, ...] = ()
    """Added lines of the kept patch that may tamper with the test run (at most ``MAX_SIGNALS``); not a verdict."""

    def report(self) -> list[dict[str, str]]:
        """The dropped paths for a grade report: ``[{"path", "kind", "reason"}]``."""
        return [{"path": d.path, "kind": d.kind, "reason": d.reason} for d in self.dropped]


@dataclass
class _Section:
    lines: list[str] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)  # every path a header names, as written (prefix not stripped)
    modes: set[str] = field(default_factory=set)
    new: bool = False


def _unquote(name: str) -> str:
    """A path of a diff header: C-quoted (``"a/x\\ty"``) as git writes unusual names, else as is (up to a tab)."""
    name = name.rstrip("\n").rstrip("\r")
    if not name.startswith('"'):
        return name.split("\t", 1)[0]
    out, i = bytearray(), 1
    while i < len(name) and name[i] != '"':
        c = name[i]
        if c == "\\" and i + 1 < len(name):
            nxt = name[i + 1]
            if nxt in "01234567":
                out.append(int(name[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
            out += _QUOTED_ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += c.encode()
        i += 1
    return out.decode("utf-8", errors="replace")


def _git_line_paths(rest: str) -> set[str]:
    """Every reading of ``diff --git <a> <b>``'s two names (unquoted names with spaces are ambiguous: all splits)."""
    rest = rest.rstrip("\n").rstrip("\r")
    if rest.startswith('"'):
        end = rest.find('"', 1)
        while end > 0 and rest[end - 1] == "\\":
            end = rest.find('"', end + 1)
        return {_unquote(rest[: end + 1]), _unquote(rest[end + 1 :].strip())} if end > 0 else {_unquote(rest)}
    if rest.endswith('"'):
        start = rest.find(' "')
        return {rest[:start], _unquote(rest[start + 1 :])} if start >= 0 else {rest}
    found = {rest}
    for m in re.finditer(" ", rest):
        found |= {rest[: m.start()], rest[m.end() :]}
    return found


def _candidates(path: str) -> set[str]:
    """The path as written and with its first component stripped (how ``git apply`` / ``patch -p1`` read it)."""
    if path == "/dev/null":
        return set()
    out = {path}
    if "/" in path:
        out.add(path.split("/", 1)[1])
    return out


def _is_test_module(base: str) -> bool:
    return base == "tests.py" or (base.endswith(".py") and (base.startswith("test_") or base.endswith("_test.py")))


def path_kind(path: str, *, new: bool = False) -> str | None:
    """The ``REASONS`` key that refuses ``path`` (as the repository sees it), or ``None`` when it is source."""
    if not path or path.startswith("/") or ".." in path.split("/"):
        return "unsafe_path"
    parts = [p for p in posixpath.normpath(path).split("/") if p not in ("", ".")]
    if not parts:
        return "unsafe_path"
    low = [p.lower() for p in parts]
    base = low[-1]
    if any(p.startswith(".git") for p in low):
        return "git"
    if base == "conftest.py":
        return "conftest"
    if any(p in TEST_DIRS for p in low[:-1]) or _is_test_module(base):
        return "tests"
    if base in TEST_CONFIG:
        return "test_config"
    if base in STARTUP_FILES or base.endswith(".pth"):
        return "startup_hook"
    if base == "entry_points.txt" or any(p.endswith(METADATA_SUFFIXES) for p in low):
        return "package_metadata"
    if base.endswith(COMPILED_SUFFIXES) or "__pycache__" in low or ".so." in base:
        return "compiled"
    if new and ((len(parts) == 1 and base.endswith(".py")) or (len(parts) == 2 and base == "__init__.py")):
        return "new_top_level_module"
    return None


def _section_kind(sec: _Section) -> tuple[str, str] | None:
    """(path, kind) of the first refused path of a section, or ``None`` when all of them are source."""
    if sec.modes & set(LINK_MODES):
        shown = min(sec.paths) if sec.paths else "?"
        return (shown.split("/", 1)[1] if "/" in shown else shown), "link"
    stripped = sorted(c for raw in sec.paths for c in _candidates(raw) if c != raw)
    as_written = sorted(raw for raw in sec.paths if raw != "/dev/null")
    for path in [*stripped, *as_written]:  # the repository's reading first: it names the file in the report
        kind = path_kind(path, new=sec.new)
        if kind:
            return path, kind
    return None


def _read_hunk(lines: list[str], i: int, header: re.Match[str]) -> int:
    """The index after the hunk whose ``@@`` line is ``lines[i]``, by its counts (as ``git apply`` reads it)."""
    old = int(header.group(2)) if header.group(2) is not None else 1
    new = int(header.group(4)) if header.group(4) is not None else 1
    i += 1
    while i < len(lines) and (old > 0 or new > 0):
        c = lines[i][:1]
        if c in (" ", "\n", "\r"):
            old, new = old - 1, new - 1
        elif c == "-":
            old -= 1
        elif c == "+":
            new -= 1
        elif c != "\\":
            break
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):  # "\ No newline at end of file" after the last line
        i += 1
    return i


def _is_traditional_start(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _header_line(sec: _Section, line: str) -> None:
    for key in ("rename from ", "rename to ", "copy from ", "copy to "):
        if line.startswith(key):
            sec.paths.add("x/" + _unquote(line[len(key) :]))  # these are written without a/ b/
    for key in ("old mode ", "new mode ", "deleted file mode ", "new file mode "):
        if line.startswith(key):
            sec.modes.add(line[len(key) :].strip())
    if line.startswith("new file mode ") or line.rstrip("\r\n") == "--- /dev/null":
        sec.new = True
    if line.startswith(("--- ", "+++ ")):
        sec.paths.add(_unquote(line[4:]))
    if line.startswith("index "):
        mode = line.rstrip("\r\n").split(" ")[-1]
        if mode.isdigit():
            sec.modes.add(mode)


def _read_section(lines: list[str], i: int) -> tuple[_Section, int]:
    """The section starting at ``lines[i]`` (a ``diff --git`` line or a ``---``/``+++`` pair) and the next index."""
    sec = _Section()
    git = lines[i].startswith("diff --git ")
    if git:
        sec.paths |= _git_line_paths(lines[i][len("diff --git ") :])
        sec.lines.append(lines[i])
        i += 1
        while i < len(lines) and lines[i].startswith(_GIT_HEADERS) and not lines[i].startswith("GIT binary patch"):
            _header_line(sec, lines[i])
            sec.lines.append(lines[i])
            i += 1
            if lines[i - 1].startswith("+++ "):
                break
    else:
        for line in lines[i : i + 2]:
            _header_line(sec, line)
            sec.lines.append(line)
        i += 2
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if m:
            end = _read_hunk(lines, i, m)
            sec.lines += lines[i:end]
            i = end
        elif git and lines[i].startswith("GIT binary patch"):
            end = i + 1  # base85 lines and blank separators: no space in them, so never a "diff --git" line
            while (
                end < len(lines) and not lines[end].startswith("diff --git ") and not _is_traditional_start(lines, end)
            ):
                end += 1
            sec.lines += lines[i:end]
            i = end
        else:
            break
    return sec, i


def apply_policy(patch: str) -> PolicyResult:
    """The part of ``patch`` that may reach the grader (see the module docstring), and what was dropped."""
    lines = patch.splitlines(keepends=True)
    kept: list[str] = []
    dropped: list[Dropped] = []
    sections, i = 0, 0
    while i < len(lines):
        if not (lines[i].startswith("diff --git ") or _is_traditional_start(lines, i)):
            i += 1  # outside any section: git apply skips it too; it never reaches the grader
            continue
        sec, i = _read_section(lines, i)
        sections += 1
        refused = _section_kind(sec)
        if refused is None:
            kept += sec.lines
        else:
            dropped.append(Dropped(*refused))
    text = "".join(kept)
    if text and not text.endswith("\n"):
        text += "\n"
    misread = [(p, kind) for p in git_apply_paths(text) or [] if (kind := path_kind(p))]
    if misread:
        return PolicyResult("", (*dropped, *(Dropped(p, "misread") for p, _ in misread)), sections)
    return PolicyResult(text, tuple(dropped), sections, tamper_signals(kept))


def tamper_signals(lines: list[str]) -> tuple[str, ...]:
    """The added lines among ``lines`` (a patch's) that match the tampering signals, cut to 200 characters each."""
    found = [ln.rstrip("\r\n")[:200] for ln in lines if ln.startswith("+") and not ln.startswith("+++ ")]
    return tuple(ln for ln in found if _SIGNALS.search(ln))[:MAX_SIGNALS]


def git_apply_paths(patch: str) -> list[str] | None:
    """The paths ``git apply`` (``--numstat -z``, ``-p1``) reads in ``patch``; ``None`` without git or when git
    refuses the patch (then it cannot apply it either)."""
    git = shutil.which("git")
    if git is None or not patch.strip():
        return None
    with tempfile.TemporaryDirectory(prefix="sao-policy-") as tmp:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": tmp, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
        env["GIT_CONFIG_GLOBAL"] = os.devnull
        try:
            res = subprocess.run(
                [git, "apply", "--numstat", "-z", "-"], input=patch.encode(), cwd=tmp, env=env, capture_output=True,
                timeout=60, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
    if res.returncode != 0:
        return None
    fields = res.stdout.decode("utf-8", errors="replace").split("\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        parts = fields[i].split("\t", 2)
        if len(parts) == 3 and parts[2]:
            paths.append(parts[2])
        elif len(parts) == 3:  # a rename or copy: the old and the new name follow
            paths += [f for f in fields[i + 1 : i + 3] if f]
            i += 2
        i += 1
    return paths
