"""Named offline SWE task sets: the spec forms of env.tasks, the held-out split by file, errors before any build."""

from __future__ import annotations

from typing import Any

import pytest

from sao.envs.datasets import held_out_spec, load_tasks
from sao.envs.swe.tasks import offline


def test_held_out_spec_names_the_split_of_swe_sets_only() -> None:
    assert held_out_spec("swe-offline:quickstart") == "swe-offline:quickstart:heldout"
    assert held_out_spec("swe-offline:quickstart:heldout") is None
    assert held_out_spec("arithmetic") is None and held_out_spec(None) is None


def test_unknown_sets_and_splits_are_named_before_any_build() -> None:
    with pytest.raises(ValueError, match="choose from quickstart, smoke"):
        load_tasks("swe-offline:nope")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_tasks("swe-offline:smoke:test")


def test_splits_by_file_never_share_a_file_and_keep_only_the_sets_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    def rec(i: int, path: str, op: str) -> dict[str, Any]:
        mutation = {"path": path, "operator": op}
        return {"instance_id": f"t{i}", "problem_statement": f"issue {i}", "sao_mutation": mutation}

    built = [rec(0, "a.py", "off_by_one"), rec(1, "b.py", "off_by_one"), rec(2, "a.py", "wrong_return"),
             rec(3, "c.py", "wrong_return")]  # fmt: skip
    seen: list[tuple[Any, ...]] = []

    def fake_build(
        n: int, packages: tuple[str, ...], min_per_package: int | None = None, operators: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        seen.append((n, packages, min_per_package, operators))
        return built

    monkeypatch.setattr(offline, "ensure_offline_tasks", fake_build)
    monkeypatch.setitem(
        offline.TASK_SETS, "t", offline.TaskSet(("x==1",), 4, held_out_paths=("a.py",), operators=("off_by_one",))
    )
    assert [r["instance_id"] for r in offline.task_set("t")] == ["t1"]
    assert [r["instance_id"] for r in offline.task_set("t", "heldout")] == ["t0"]
    assert seen[0] == (4, ("x==1",), None, ("off_by_one",))  # the build searches the set's families only
    monkeypatch.setitem(offline.TASK_SETS, "u", offline.TaskSet(("x==1",), 4, held_out_paths=("z.py",)))
    with pytest.raises(RuntimeError, match="no heldout tasks"):
        offline.task_set("u", "heldout")


def test_a_split_by_function_holds_out_a_fixed_share_of_functions_and_every_bug_in_them() -> None:
    ts = offline.TaskSet(("x==1",), 4, held_out_functions=1 / 3)
    fns = [{"path": f"p{i % 7}.py", "function": f"f{i}"} for i in range(600)]
    held = [m for m in fns if ts.held_out(m)]
    assert 150 < len(held) < 250  # about a third, by a fixed hash: the same on every machine and run
    assert held == [m for m in fns if offline.TaskSet(("x==1",), 4, held_out_functions=1 / 3).held_out(m)]
    # two bugs in one function fall on the same side; a held-out path holds out every function in it
    assert all(ts.held_out({**m, "operator": "x"}) for m in held)
    assert offline.TaskSet(("x==1",), 4, held_out_paths=("p1.py",)).held_out({"path": "p1.py", "function": "g"})
    assert not offline.TaskSet(("x==1",), 4).held_out(fns[0])


def test_a_localized_set_names_each_bugs_function_and_drops_repeated_issues(monkeypatch: pytest.MonkeyPatch) -> None:
    def rec(i: int, fn: str, statement: str) -> dict[str, Any]:
        mutation = {"path": "pkg/m.py", "function": fn, "operator": "off_by_one"}
        return {"instance_id": f"t{i}", "problem_statement": statement, "sao_mutation": mutation}

    # t0 and t1 fail alike (one statement) in two functions; t2 repeats t0's function and statement
    built = [rec(0, "C.f", "`test_x` fails\n"), rec(1, "g", "`test_x` fails\n"), rec(2, "C.f", "`test_x` fails\n")]
    monkeypatch.setattr(offline, "ensure_offline_tasks", lambda *a, **k: built)
    monkeypatch.setitem(offline.TASK_SETS, "loc", offline.TaskSet(("x==1",), 4, hint="function"))
    monkeypatch.setitem(offline.TASK_SETS, "raw", offline.TaskSet(("x==1",), 4))
    loc = offline.task_set("loc")
    assert [r["instance_id"] for r in loc] == ["t0", "t1"]  # t2's issue, hint included, is t0's
    assert loc[0]["problem_statement"].endswith("the function `f` (`C.f`) in `pkg/m.py`.\n")
    assert loc[1]["problem_statement"].endswith("the function `g` in `pkg/m.py`.\n")
    assert built[0]["problem_statement"] == "`test_x` fails\n"  # the cached records are not changed
    assert [r["instance_id"] for r in offline.task_set("raw")] == ["t0"]  # without the hint all three read alike
    with pytest.raises(ValueError, match="TaskSet hint 'lines'"):
        offline.TaskSet(("x==1",), 4, hint="lines")
