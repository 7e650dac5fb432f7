"""sao.core.jsonl, the one durable writer: the reader (line numbers, blank lines, errors naming file and line, the
torn-tail rule), the appender's repair of a torn last line, and atomic whole-file writes."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest
import yaml

from sao.core.jsonl import (
    JsonlAppender,
    append_jsonl,
    atomic_path,
    iter_jsonl,
    write_json_atomic,
    write_text_durably,
    write_yaml_atomic,
)


class MyError(ValueError):
    pass


def test_yields_numbered_values_and_skips_blank_lines(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n[2]\n')
    assert list(iter_jsonl(p)) == [(1, {"a": 1}), (3, [2])]


def test_line_separators_inside_json_strings_do_not_split_a_line(tmp_path: Path) -> None:
    # issue 44: str.splitlines() also cuts at U+2028, U+2029 and U+0085, which JSON may hold unescaped
    # (json.dumps(..., ensure_ascii=False), user SFT data and task files)
    recs = [{"text": "a\u2028b\u2029c"}, {"text": "d\x85e"}]
    p = tmp_path / "u.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    assert list(iter_jsonl(p)) == [(1, recs[0]), (2, recs[1])]
    p.write_text('{"a": 1}\r\n{"b": 2}', encoding="utf-8")  # CRLF line ends, no final newline
    assert list(iter_jsonl(p)) == [(1, {"a": 1}), (2, {"b": 2})]


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


def _records(p: Path) -> list[object]:
    return [v for _, v in iter_jsonl(p)]


def test_a_torn_last_line_is_cut_off_and_kept_before_each_append_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bug: the next record was glued onto the fragment (and lost with it), and the append after that made the
    file unreadable. Tear, append, read; twice: every good record is there, each fragment is in its side file."""
    p = tmp_path / "ledger.jsonl"
    append_jsonl(p, [{"a": 1}, {"b": 2}])
    fragments = [b'{"type": "trajectory", "uid": "u9", "traj', b'{"type": "ev']
    for i, fragment in enumerate(fragments):
        with open(p, "ab") as f:  # what a kill in the middle of a write leaves
            f.write(fragment)
        with caplog.at_level(logging.WARNING, logger="sao.core.jsonl"):
            append_jsonl(p, [{"resume": i}])
        append_jsonl(p, [{"after": i}])
        assert _records(p)[-2:] == [{"resume": i}, {"after": i}], "strict read: every line is whole"
    assert _records(p) == [{"a": 1}, {"b": 2}, {"resume": 0}, {"after": 0}, {"resume": 1}, {"after": 1}]
    sides = sorted(tmp_path.glob("ledger.jsonl.torn-*"))
    assert [s.read_bytes() for s in sides] == fragments
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(str(p) in w for w in warnings)
    assert [str(s) for s in sides] == [w.rsplit("kept in ", 1)[1] for w in warnings]


def test_a_held_open_appender_repairs_too_and_a_whole_file_is_left_alone(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    with JsonlAppender(p) as out:
        out.append({"c": 3})
        with open(p, "ab") as f:
            f.write(b"x" * 100_000)  # a fragment longer than one backward read, no newline in it
        out.append({"d": 4})
    assert _records(p) == [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]
    (side,) = tmp_path.glob("m.jsonl.torn-*")
    assert side.read_bytes() == b"x" * 100_000


def test_a_file_that_is_one_torn_line_is_emptied_and_kept(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_bytes(b'{"instance_id": "x", "model_pa')
    append_jsonl(p, [{"instance_id": "y"}])
    assert _records(p) == [{"instance_id": "y"}]
    assert [s.read_bytes() for s in tmp_path.glob("p.jsonl.torn-*")] == [b'{"instance_id": "x", "model_pa']


def test_appenders_in_threads_never_interleave_lines(tmp_path: Path) -> None:
    """collect appends from worker threads: each append is whole, and no appender mistakes another's line
    for a torn one."""
    p = tmp_path / "c.jsonl"
    big = "y" * 200_000

    def work(k: int) -> None:
        for i in range(20):
            append_jsonl(p, [{"k": k, "i": i, "pad": big}])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = _records(p)
    assert sorted((r["k"], r["i"]) for r in got) == [(k, i) for k in range(4) for i in range(20)]  # type: ignore[index]
    assert not list(tmp_path.glob("c.jsonl.torn-*"))


def test_atomic_writes_leave_the_old_content_or_the_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "summary.json"
    write_json_atomic(p, {"v": 1})
    # A crash after part of the new content is written: the old file is whole, no temp file is left.
    with pytest.raises(RuntimeError, match="killed"), atomic_path(p) as tmp:
        tmp.write_text('{"v": 2, "par')
        raise RuntimeError("killed")
    assert yaml.safe_load(p.read_text()) == {"v": 1}
    # A failed rename (disk full, ...) likewise.
    real = os.replace

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_text_durably(p, "new")
    monkeypatch.setattr(os, "replace", real)
    assert yaml.safe_load(p.read_text()) == {"v": 1}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["summary.json"]
    write_yaml_atomic(p, {"z": 1, "a": [1, 2]})
    assert p.read_text() == "z: 1\na:\n- 1\n- 2\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["summary.json"]


def test_atomic_writes_fsync_the_file_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_text_durably(tmp_path / "a.txt", "hello")
    assert len(events) == 3 and events[0].endswith(".tmp") and "/.a.txt." in events[0]
    assert events[1:] == ["replace", f"fsync {tmp_path}"]
    assert (tmp_path / "a.txt").read_text() == "hello"
