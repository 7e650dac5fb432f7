"""sao.core.jsonl.iter_jsonl: line numbers, blank lines, errors naming file and line, the torn-tail rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.core.jsonl import iter_jsonl


class MyError(ValueError):
    pass


def test_yields_numbered_values_and_skips_blank_lines(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n[2]\n')
    assert list(iter_jsonl(p)) == [(1, {"a": 1}), (3, [2])]


def test_bad_line_names_file_line_and_fix(tmp_path: Path) -> None:
    p = tmp_path / "b.jsonl"
    p.write_text('{"a": 1}\n{oops\n{"c": 3}\n')
    with pytest.raises(MyError, match=r"b\.jsonl:2: not valid JSON .*; rewrite it"):
        list(iter_jsonl(p, error=MyError, fix="rewrite it"))


def test_torn_tail_is_skipped_only_at_the_end(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text('{"a": 1}\n{"b": ')
    assert list(iter_jsonl(p, torn_tail_ok=True)) == [(1, {"a": 1})]
    with pytest.raises(ValueError, match=r"c\.jsonl:2"):
        list(iter_jsonl(p))
    p.write_text('{"b": \n{"a": 1}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:1"):
        list(iter_jsonl(p, torn_tail_ok=True))
