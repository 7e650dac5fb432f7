"""AST mutation operators: each makes one local, parseable change and leaves the rest of the file untouched."""

from __future__ import annotations

import ast
import difflib

import pytest

from sao.envs.swe.tasks.mutations import OPERATORS, Mutation, is_valid, mutations

SRC = '''"""Module."""


def clamp(x, lo, hi):
    """Docstring with 1 number < 2."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def first(items):
    return items[0]


def head(items, n):
    return items[:n]


def both(a, b):
    return a and b


def pick(flag):
    if flag:
        value = "yes"
    else:
        value = "no"
    return value


class Box:
    def ratio(self, a, b):
        return divmod(a, b)

    def outer(self):
        def inner(v):
            return v == 1
        return inner
'''


def _changed_lines(new: str) -> list[str]:
    diff = difflib.unified_diff(SRC.splitlines(), new.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def _by_op(op: str) -> list[Mutation]:
    return [m for m in mutations(SRC, "m.py") if m.operator == op]


def test_every_operator_fires_and_every_mutation_parses() -> None:
    muts = list(mutations(SRC, "m.py"))
    assert {m.operator for m in muts} == set(OPERATORS)
    for m in muts:
        assert m.source != SRC
        ast.parse(m.source)


def test_comparison_flip_changes_only_the_operator() -> None:
    m = next(m for m in _by_op("comparison_flip") if m.function == "clamp" and m.lineno == 6)
    assert _changed_lines(m.source) == ["-    if x < lo:", "+    if x >= lo:"]


def test_off_by_one_on_index_and_slice_bound() -> None:
    idx = {tuple(_changed_lines(m.source)) for m in _by_op("off_by_one") if m.function == "first"}
    assert ("-    return items[0]", "+    return items[1]") in idx
    assert ("-    return items[0]", "+    return items[(-1)]") in idx
    sl = {tuple(_changed_lines(m.source)) for m in _by_op("off_by_one") if m.function == "head"}
    assert ("-    return items[:n]", "+    return items[:n + 1]") in sl


def test_removed_branch_drops_guard_or_else_block() -> None:
    guards = [m for m in _by_op("removed_branch") if m.function == "clamp"]
    assert any(_changed_lines(m.source) == ["-    if x < lo:", "-        return lo"] for m in guards)
    els = next(m for m in _by_op("removed_branch") if m.function == "pick")
    assert _changed_lines(els.source) == ["-    else:", '-        value = "no"']


def test_swapped_args_and_wrong_return_and_bool_op() -> None:
    sw = next(m for m in _by_op("swapped_args") if m.function == "Box.ratio")
    assert _changed_lines(sw.source) == ["-        return divmod(a, b)", "+        return divmod(b, a)"]
    wr = {tuple(_changed_lines(m.source)) for m in _by_op("wrong_return") if m.function == "first"}
    assert wr == {("-    return items[0]", "+    return None")}
    neg = next(m for m in _by_op("wrong_return") if m.function == "Box.outer.inner")
    assert _changed_lines(neg.source) == ["-            return v == 1", "+            return not (v == 1)"]
    bo = next(m for m in _by_op("bool_op_swap") if m.function == "both")
    assert _changed_lines(bo.source) == ["-    return a and b", "+    return (a or b)"]


def test_docstrings_are_never_mutated_and_nested_functions_are_named() -> None:
    for m in mutations(SRC, "m.py"):
        assert "Docstring with 1 number < 2." in m.source
    names = {m.function for m in mutations(SRC, "m.py")}
    assert {"clamp", "Box.ratio", "Box.outer.inner"} <= names


def test_unknown_operator_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown mutation operators"):
        list(mutations(SRC, "m.py", ("nope",)))


def test_lone_guard_becomes_pass_so_the_block_stays_valid() -> None:
    src = "def f(x):\n    for i in x:\n        if i:\n            raise ValueError(i)\n    return 1\n"
    m = next(m for m in mutations(src, "f.py", ("removed_branch",)))
    assert "        pass\n" in m.source and is_valid(m.source)


def test_unicode_columns_are_handled() -> None:
    src = 'def f(s):\n    return "é" + s if len(s) > 1 else s\n'
    m = next(m for m in mutations(src, "f.py", ("comparison_flip",)))
    assert "len(s) <= 1" in m.source and '"é"' in m.source
