"""AST mutation operators that inject one plausible bug into a Python module, editing only the mutated span.

Each operator walks the module's AST and yields ``Mutation``s: the new source text (the rest of the file is
byte-for-byte unchanged, so the patch is small and reads like a human slip) plus where and what changed.
Operators: comparison flip, off-by-one (integer constants and slice bounds), removed branch (an ``if`` guard
without ``else``, or an ``else`` block), swapped call arguments, wrong return (``None`` / negated bool), and/or swap.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

OPERATORS = ("comparison_flip", "off_by_one", "removed_branch", "swapped_args", "wrong_return", "bool_op_swap")

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


@dataclass(frozen=True)
class Mutation:
    """One injected bug: ``source`` is the whole mutated module text."""

    operator: str
    path: str
    function: str
    lineno: int
    description: str
    source: str


class _Text:
    """Source text with (line, utf-8 column) -> character offset conversion, as ``ast`` reports positions."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def segment(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.source[a:b]

    def replace(self, a: int, b: int, new: str) -> str:
        return self.source[:a] + new + self.source[b:]

    def replace_lines(self, first: int, last: int, new_lines: str) -> str:
        """Replace whole lines ``first..last`` (1-based, inclusive)."""
        return self.source[: self.starts[first - 1]] + new_lines + self.source[self.starts[last] :]


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, function node) for every function, methods included."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    yield from walk(tree, "")


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Nodes of ``func``'s body, not descending into nested functions/classes (they are visited on their own)."""
    # f-string internals have unreliable positions on 3.11; nested scopes are mutated on their own.
    skip = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.JoinedStr)
    stack = [n for n in getattr(func, "body", []) if not isinstance(n, skip)]
    while stack:
        node = stack.pop(0)
        yield node
        stack += [c for c in ast.iter_child_nodes(node) if not isinstance(c, skip)]


def _is_docstring(node: ast.AST, func: ast.AST) -> bool:
    body = getattr(func, "body", [])
    return bool(body) and isinstance(body[0], ast.Expr) and body[0].value is node


def _comparison_flip(t: _Text, node: ast.AST) -> Iterator[tuple[str, str]]:
    if isinstance(node, ast.Compare) and node.lineno == node.end_lineno and len(node.ops) == 1:
        flipped = _FLIP.get(type(node.ops[0]))
        if flipped is not None:
            new = ast.Compare(left=node.left, ops=[flipped()], comparators=node.comparators)
            a, b = t.span(node)
            yield f"flip `{ast.unparse(node)}` to `{ast.unparse(new)}`", t.replace(a, b, ast.unparse(new))


def _off_by_one(t: _Text, node: ast.AST) -> Iterator[tuple[str, str]]:
    if isinstance(node, ast.Constant) and type(node.value) is int and node.lineno == node.end_lineno:
        for delta in (1, -1):
            value = node.value + delta
            text = str(value) if value >= 0 else f"({value})"
            a, b = t.span(node)
            yield f"constant {node.value} -> {value}", t.replace(a, b, text)
    elif isinstance(node, ast.Slice):
        for part in (node.lower, node.upper):
            if isinstance(part, ast.Name | ast.Attribute) and part.lineno == part.end_lineno:
                for sign in ("+", "-"):
                    a, b = t.span(part)
                    yield f"slice bound `{t.segment(part)}` {sign} 1", t.replace(a, b, f"{t.segment(part)} {sign} 1")


def _block_lines(t: _Text, first: ast.stmt, last: ast.stmt) -> tuple[int, int, str]:
    indent = t.lines[first.lineno - 1][: first.col_offset]
    return first.lineno, last.end_lineno or last.lineno, indent


def _removed_branch(t: _Text, node: ast.AST, parent_bodies: dict[int, list[ast.stmt]]) -> Iterator[tuple[str, str]]:
    if not isinstance(node, ast.If):
        return
    siblings = parent_bodies.get(id(node))
    if siblings is None:
        return
    if not node.orelse:
        # Drop the whole guard; a lone statement becomes `pass` so the block stays valid.
        first, last, indent = _block_lines(t, node, node)
        if t.lines[first - 1][: node.col_offset].strip():
            return
        repl = f"{indent}pass\n" if len(siblings) == 1 else ""
        yield f"remove the `if {ast.unparse(node.test)}` branch", t.replace_lines(first, last, repl)
    elif not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):
        # Drop a plain `else:` block (not an elif chain): the `else:` line sits just above its first statement.
        else_line = node.orelse[0].lineno - 1
        if t.lines[else_line - 1].strip() != "else:":
            return
        last = node.orelse[-1].end_lineno or node.orelse[-1].lineno
        yield f"remove the `else` branch of `if {ast.unparse(node.test)}`", t.replace_lines(else_line, last, "")


def _swapped_args(t: _Text, node: ast.AST) -> Iterator[tuple[str, str]]:
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return
    x, y = node.args[0], node.args[1]
    if isinstance(x, ast.Starred) or isinstance(y, ast.Starred):
        return
    sx, sy = t.segment(x), t.segment(y)
    if sx == sy:
        return
    (ax, bx), (ay, by) = t.span(x), t.span(y)
    new = t.source[:ax] + sy + t.source[bx:ay] + sx + t.source[by:]
    yield f"swap arguments `{sx}` and `{sy}` of `{t.segment(node.func)}(...)`", new


def _wrong_return(t: _Text, node: ast.AST) -> Iterator[tuple[str, str]]:
    if not isinstance(node, ast.Return) or node.value is None:
        return
    value = node.value
    a, b = t.span(value)
    boolish = isinstance(value, ast.Compare | ast.BoolOp) or (
        isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not)
    )
    if isinstance(value, ast.Constant) and type(value.value) is bool:
        yield f"return {not value.value} instead of {value.value}", t.replace(a, b, str(not value.value))
    elif boolish:
        yield f"negate the returned `{t.segment(value)}`", t.replace(a, b, f"not ({t.segment(value)})")
    elif not (isinstance(value, ast.Constant) and value.value is None):
        yield "return None instead of the value", t.replace(a, b, "None")


def _bool_op_swap(t: _Text, node: ast.AST) -> Iterator[tuple[str, str]]:
    if isinstance(node, ast.BoolOp) and node.lineno == node.end_lineno:
        new = ast.BoolOp(op=ast.Or() if isinstance(node.op, ast.And) else ast.And(), values=node.values)
        a, b = t.span(node)
        yield f"`{ast.unparse(node)}` -> `{ast.unparse(new)}`", t.replace(a, b, f"({ast.unparse(new)})")


_SIMPLE: dict[str, Callable[[_Text, ast.AST], Iterator[tuple[str, str]]]] = {
    "comparison_flip": _comparison_flip,
    "off_by_one": _off_by_one,
    "swapped_args": _swapped_args,
    "wrong_return": _wrong_return,
    "bool_op_swap": _bool_op_swap,
}


def is_valid(source: str) -> bool:
    """Whether mutated ``source`` still parses (operators are local text edits, so a few do not)."""
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def mutations(
    source: str, path: str, operators: tuple[str, ...] = OPERATORS, validate: bool = True
) -> Iterator[Mutation]:
    """Every single-site mutation of the functions in ``source`` that changes the text (and, with ``validate``,
    still parses: callers with many candidates pass ``validate=False`` and check ``is_valid`` when they try one)."""
    unknown = set(operators) - set(OPERATORS)
    if unknown:
        raise ValueError(f"unknown mutation operators {sorted(unknown)}; choose from {', '.join(OPERATORS)}")
    tree = ast.parse(source)
    t = _Text(source)
    for fname, func in _functions(tree):
        parent_bodies: dict[int, list[ast.stmt]] = {}
        for n in [func, *_own_nodes(func)]:
            for field in ("body", "orelse", "finalbody"):
                block = getattr(n, field, None)
                if isinstance(block, list):
                    for stmt in block:
                        parent_bodies[id(stmt)] = block
        for node in _own_nodes(func):
            if _is_docstring(node, func):
                continue
            found: list[tuple[str, str, str]] = []
            for op in operators:
                if op == "removed_branch":
                    found += [(op, d, s) for d, s in _removed_branch(t, node, parent_bodies)]
                else:
                    found += [(op, d, s) for d, s in _SIMPLE[op](t, node)]
            for op, desc, new_source in found:
                if new_source == source or (validate and not is_valid(new_source)):
                    continue
                yield Mutation(op, path, fname, getattr(node, "lineno", 0), desc, new_source)
