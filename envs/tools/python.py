"""``python``: runs code in the sandbox with notebook-like state: variables and imports persist across calls.

How state persists (by design, replay): each call saves its cell as a file in a per-episode folder inside the
sandbox and runs a small runner script there with the sandbox's ``python3``. The runner first re-executes, in
one namespace and with their output discarded, every earlier cell that succeeded, then runs the new cell and
prints its output (plus the ``repr`` of a final expression, like a notebook). A cell that raises prints its
traceback and is not replayed later. Why replay and not a long-lived REPL process: it needs nothing but
``python3`` and a shell, so it works the same in a Docker container and in a bwrap sandbox (where no process
outlives one command). Consequences to know: the timeout covers the replay too; cells with side effects or
randomness run again on every call (files they append to grow; random draws differ unless seeded).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from sao.envs.protocols import ToolResult
from sao.envs.tools._common import ArgError, command_output, function_schema, quote, require
from sao.sandboxes.protocols import Sandbox

MAX_CELL_CHARS = 64_000  # the cell travels base64-encoded in one argv string (Linux caps one at 128 KiB)

_RUNNER = r"""
import ast, contextlib, io, json, os, sys, traceback
d = os.path.dirname(os.path.abspath(__file__))
n = int(sys.argv[1])
okf = os.path.join(d, "ok.json")
ok = json.load(open(okf)) if os.path.exists(okf) else []
ns = {"__name__": "__main__", "__builtins__": __builtins__}
sink = io.StringIO()
for i in ok:
    p = os.path.join(d, "cell_%d.py" % i)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            exec(compile(open(p).read(), p, "exec"), ns)
    except BaseException:
        pass
p = os.path.join(d, "cell_%d.py" % n)
src = open(p).read()
try:
    tree = ast.parse(src, p)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, p, "exec"), ns)
    if last is not None:
        value = eval(compile(last, p, "eval"), ns)
        if value is not None:
            print(repr(value))
except BaseException:
    et, ev, tb = sys.exc_info()
    sys.stdout.flush()
    traceback.print_exception(et, ev, tb.tb_next, file=sys.stdout)
    sys.stdout.flush()
    os._exit(1)
ok.append(n)
with open(okf, "w") as f:
    json.dump(ok, f)
"""


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class PythonTool:
    """Notebook-like python in the sandbox (state by replay, see the module doc); one instance per episode."""

    name = "python"

    def __init__(
        self,
        sandbox: Sandbox,
        workdir: str | None = None,
        timeout: float = 30.0,
        max_output: int = 8_000,
        python: str = "python3",
    ):
        self.sandbox, self.workdir, self.timeout, self.max_output = sandbox, workdir, timeout, max_output
        self.python = python
        self._dir = f".sao_python_{secrets.token_hex(4)}"
        self._cells = 0

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(
            self.name,
            "Run Python code. Variables and imports persist between calls, like a notebook. Print what you "
            f"need to see (a final expression is shown too). Timeout {self.timeout:g} s; long output is cut.",
            {"code": {"type": "string", "description": "The Python code to run."}},
            ["code"],
        )

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            code = require(arguments, "code", str, self.name)
            if not code.strip():
                raise ArgError("python: the code is empty.")
            if len(code) > MAX_CELL_CHARS:
                raise ArgError(f"python: the code has {len(code)} characters; the limit is {MAX_CELL_CHARS}.")
        except ArgError as e:
            return ToolResult(str(e), error=True)
        n = self._cells
        self._cells += 1
        d = quote(self._dir)
        steps = [f"mkdir -p {d}"]
        if n == 0:
            steps.append(f"printf '%s' {_b64(_RUNNER)} | base64 -d > {d}/run.py")
        steps.append(f"printf '%s' {_b64(code)} | base64 -d > {d}/cell_{n}.py")
        steps.append(f"{self.python} {d}/run.py {n}")
        res = await self.sandbox.exec(" && ".join(steps), timeout=self.timeout, workdir=self.workdir)
        # Exit 1 is a cell that raised: its traceback already says so.
        out = command_output(res, self.max_output, self.timeout, explained_exit=1)
        return ToolResult(out, exit_code=res.exit_code)
