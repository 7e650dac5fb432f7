"""``str_replace_editor``: view / create / str_replace / insert / undo_edit on files inside the sandbox.

Files are read and written with ``sandbox.read_file``/``write_file``; existence and directory listings go through
``sandbox.exec`` (``test``, ``find``), so the tool works on any sandbox with a POSIX shell. Every error names what
went wrong and what to do, so the model can act on it: a ``str_replace`` whose ``old_str`` is absent or appears
more than once replaces nothing and says so (with the line numbers of the matches). ``undo_edit`` restores the
content before the last create/str_replace/insert of that path in this episode (the tool keeps the history).
What the sandbox refuses for the agent's own reasons (a file it may not write, the disk limit, a file too big to
read, a helper command killed for memory or at its timeout) is told to the model as the tool's error, with how
the command ended; only a ``SandboxError`` (the sandbox itself failed) propagates.
"""

from __future__ import annotations

import posixpath
from typing import Any

from sao.envs.protocols import ToolResult
from sao.envs.tools._common import ArgError, cap_text, function_schema, how_it_ended, quote, require
from sao.sandboxes.protocols import Sandbox

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
_SNIPPET = 4
_HELPER_TIMEOUT_S = 30.0


def _numbered(lines: list[str], start: int) -> str:
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, start))


def _lines(content: str) -> list[str]:
    """Lines of a file, without the empty string after a final newline."""
    parts = content.split("\n")
    return parts[:-1] if content.endswith("\n") else parts


class EditorTool:
    """The editor; paths are absolute, or relative to ``workdir`` when one is given."""

    name = "str_replace_editor"

    def __init__(self, sandbox: Sandbox, workdir: str | None = None, max_output: int = 16_000):
        self.sandbox, self.workdir, self.max_output = sandbox, workdir, max_output
        self._history: dict[str, list[str | None]] = {}

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(
            self.name,
            "View, create and edit files. view: a file with line numbers (optional view_range [start, end], "
            "end -1 = to the end) or a directory listing. create: a new file with file_text. str_replace: replace "
            "old_str, which must appear exactly once, by new_str. insert: insert new_str after line insert_line "
            "(0 = at the top). undo_edit: revert the last edit of the file.",
            {
                "command": {"type": "string", "enum": list(COMMANDS)},
                "path": {"type": "string", "description": "Path of the file or directory."},
                "file_text": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
                "insert_line": {"type": "integer"},
                "view_range": {"type": "array", "items": {"type": "integer"}},
            },
            ["command", "path"],
        )

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            command = require(arguments, "command", str, self.name)
            if command not in COMMANDS:
                raise ArgError(f"{self.name}: unknown command {command!r}; use one of {', '.join(COMMANDS)}.")
            path = self._resolve(require(arguments, "path", str, self.name))
            out = await getattr(self, f"_{command}")(path, arguments)
        except ArgError as e:
            return ToolResult(str(e), error=True)
        except OSError as e:  # read_file / write_file refused it (permission, disk limit, size); not the sandbox
            return ToolResult(f"{self.name}: {e.strerror or e}", error=True)
        return ToolResult(cap_text(out, self.max_output))

    def _resolve(self, path: str) -> str:
        if not path.strip():
            raise ArgError(f"{self.name}: 'path' is empty.")
        if not posixpath.isabs(path):
            if self.workdir is None:
                raise ArgError(f"{self.name}: path {path!r} is not absolute; give the full path (starting with /).")
            path = posixpath.join(self.workdir, path)
        return posixpath.normpath(path)

    async def _run(self, cmd: str) -> str:
        """Run a helper command; one that does not exit 0 is the model's to know about (``ArgError``)."""
        res = await self.sandbox.exec(cmd, timeout=_HELPER_TIMEOUT_S, workdir=self.workdir)
        if res.exit_code != 0 or res.timed_out:
            raise ArgError(
                f"{self.name}: `{cmd}` failed: {res.output.strip()[-500:]}\n{how_it_ended(res, _HELPER_TIMEOUT_S)}"
            )
        return res.output

    async def _kind(self, path: str) -> str:
        q = quote(path)
        out = await self._run(
            f"if [ -d {q} ]; then echo dir; elif [ -f {q} ]; then echo file; "
            f"elif [ -e {q} ]; then echo other; else echo missing; fi"
        )
        return out.strip().splitlines()[-1] if out.strip() else "missing"

    async def _existing_file(self, path: str) -> str:
        kind = await self._kind(path)
        if kind == "missing":
            raise ArgError(f"The path {path} does not exist. Use command 'create' to make a new file.")
        if kind != "file":
            raise ArgError(f"The path {path} is a directory, not a file; 'view' it to list its files.")
        return await self.sandbox.read_file(path)

    async def _write(self, path: str, old: str | None, new: str) -> None:
        await self.sandbox.write_file(path, new)
        self._history.setdefault(path, []).append(old)

    def _snippet(self, path: str, content: str, first: int, last: int) -> str:
        lines = _lines(content)
        lo, hi = max(1, first - _SNIPPET), min(len(lines), last + _SNIPPET)
        return f"The file {path} was edited. Lines {lo}-{hi} now read:\n{_numbered(lines[lo - 1 : hi], lo)}"

    async def _view(self, path: str, arguments: dict[str, Any]) -> str:
        kind = await self._kind(path)
        if kind == "missing":
            raise ArgError(f"The path {path} does not exist.")
        if kind == "dir":
            if arguments.get("view_range") is not None:
                raise ArgError("view_range only applies to files, not directories.")
            out = await self._run(f"find {quote(path)} -maxdepth 2 -not -path '*/.*' | sort | head -n 400")
            return f"Files and directories up to 2 levels deep in {path}:\n{out.rstrip()}"
        if kind != "file":
            raise ArgError(f"The path {path} is neither a file nor a directory.")
        lines = _lines(await self.sandbox.read_file(path))
        start, end = 1, len(lines)
        rng = arguments.get("view_range")
        if rng is not None:
            if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, int) for x in rng)):
                raise ArgError("view_range must be a list of two integers [start, end].")
            start, end = rng[0], (len(lines) if rng[1] == -1 else rng[1])
            if not 1 <= start <= max(1, len(lines)):
                raise ArgError(f"view_range start {start} is outside the file's lines 1-{len(lines)}.")
            if end < start or end > len(lines):
                raise ArgError(f"view_range end {rng[1]} must be in [{start}, {len(lines)}] or -1.")
        return f"Here is {path} (lines {start}-{end} of {len(lines)}):\n{_numbered(lines[start - 1 : end], start)}"

    async def _create(self, path: str, arguments: dict[str, Any]) -> str:
        text = require(arguments, "file_text", str, "create")
        if await self._kind(path) != "missing":
            raise ArgError(f"The path {path} already exists; create does not overwrite. Use str_replace to edit it.")
        parent = posixpath.dirname(path)
        if parent:
            await self._run(f"mkdir -p {quote(parent)}")
        await self._write(path, None, text)
        return f"File created at {path} ({len(_lines(text))} lines)."

    async def _str_replace(self, path: str, arguments: dict[str, Any]) -> str:
        old_str = require(arguments, "old_str", str, "str_replace")
        new_str = arguments.get("new_str") or ""
        if not isinstance(new_str, str):
            raise ArgError("str_replace: 'new_str' must be a string.")
        if not old_str:
            raise ArgError("str_replace: 'old_str' is empty; give the exact text to replace.")
        content = await self._existing_file(path)
        count = content.count(old_str)
        if count == 0:
            hint = ""
            if old_str.strip() and old_str.strip() in content:
                hint = " Its text appears with different surrounding whitespace: copy it exactly, indentation included."
            raise ArgError(f"No replacement was performed: old_str did not appear verbatim in {path}.{hint}")
        if count > 1:
            starts, pos = [], content.find(old_str)
            while pos != -1:
                starts.append(content.count("\n", 0, pos) + 1)
                pos = content.find(old_str, pos + 1)
            raise ArgError(
                f"No replacement was performed: old_str appears {count} times in {path}, at lines {starts}. "
                "Include more surrounding lines so it is unique."
            )
        new_content = content.replace(old_str, new_str, 1)
        await self._write(path, content, new_content)
        first = content[: content.find(old_str)].count("\n") + 1
        return self._snippet(path, new_content, first, first + new_str.count("\n"))

    async def _insert(self, path: str, arguments: dict[str, Any]) -> str:
        line = require(arguments, "insert_line", int, "insert")
        new_str = require(arguments, "new_str", str, "insert")
        content = await self._existing_file(path)
        lines = _lines(content)
        if not 0 <= line <= len(lines):
            raise ArgError(f"insert_line {line} is outside [0, {len(lines)}] (the file has {len(lines)} lines).")
        new_lines = lines[:line] + _lines(new_str if new_str.endswith("\n") else new_str + "\n") + lines[line:]
        trailing = "\n" if content.endswith("\n") or not content else ""
        new_content = "\n".join(new_lines) + trailing
        await self._write(path, content, new_content)
        return self._snippet(path, new_content, line + 1, line + len(_lines(new_str + "\n")))

    async def _undo_edit(self, path: str, arguments: dict[str, Any]) -> str:
        history = self._history.get(path)
        if not history:
            raise ArgError(f"No edit of {path} to undo in this episode.")
        previous = history.pop()
        if previous is None:
            await self._run(f"rm -f {quote(path)}")
            return f"Undid the creation of {path} (file removed)."
        await self.sandbox.write_file(path, previous)
        return f"Undid the last edit of {path}. It has {len(_lines(previous))} lines again."
