"""Pure parts of the task builder: which test files a mutation is validated on, and the candidate order."""

from __future__ import annotations

from typing import Any

import pytest

from sao.envs.swe.tasks.builder import BuildConfig, _candidates, _relevant_tests
from sao.envs.swe.tasks.mutations import Mutation

SOURCES = {
    "pkg/core.py": (
        "def area(w, h):\n    if w < 0:\n        return 0\n    return w * h\n\n\ndef unused(x):\n    return x + 1\n"
    ),
}
TESTS = {
    "tests/test_core.py": "from pkg.core import area\n\ndef test_area():\n    assert area(2, 3) == 6\n",
    "tests/test_other.py": "from pkg.core import area\n\ndef test_other():\n    assert area(1, 1) == 1\n",
    "tests/test_misc.py": "def test_misc():\n    assert True\n",
}


def test_relevant_tests_prefers_files_named_after_the_module() -> None:
    m = Mutation("comparison_flip", "pkg/core.py", "area", 2, "", "")
    assert _relevant_tests(m, TESTS, limit=3) == ["tests/test_core.py", "tests/test_other.py"]
    assert _relevant_tests(m, TESTS, limit=1) == ["tests/test_core.py"]
    dunder = Mutation("wrong_return", "pkg/core.py", "Box.__eq__", 2, "", "")
    assert _relevant_tests(dunder, {"t/test_box.py": "Box() == Box()"}, 3) == ["t/test_box.py"]


def test_candidates_skip_untested_functions_and_interleave_operators() -> None:
    cands = _candidates(SOURCES, TESTS, BuildConfig(sdists=["x==1"], seed=1))
    assert cands and all(c.mutation.function == "area" for c in cands)
    ops = [c.mutation.operator for c in cands]
    assert len(set(ops[: len(set(ops))])) == len(set(ops))  # one of each operator before any repeats
    again = _candidates(SOURCES, TESTS, BuildConfig(sdists=["x==1"], seed=1))
    assert [c.mutation.description for c in again] == [c.mutation.description for c in cands]


def test_build_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="at least 1 bug"):
        BuildConfig(sdists=["x==1"], bugs=0)
    with pytest.raises(ValueError, match="no sdist"):
        BuildConfig(sdists=[])
    with pytest.raises(ValueError, match="name==version"):
        BuildConfig(sdists=["click"])
    with pytest.raises(ValueError, match="unknown mutation operators"):
        BuildConfig(sdists=["click==8.5.1"], operators=("typo",))


def test_a_bug_whose_fix_the_package_repeats_in_the_same_file_is_dropped_other_copies_fail_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sao.envs.swe.tasks import builder, fetch
    from sao.envs.swe.tasks.mutations import Mutation

    m = Mutation("comparison_flip", "pkg/core.py", "area", 3, "flip", "def area(w, h):\n    return w * h\n")
    found = builder._Found(m, "diff --git a/pkg/core.py b/pkg/core.py\n", ["t::a"], [], ["t"], [])
    copies: list[str] = []
    monkeypatch.setattr(builder.images, "ensure_task_image", lambda repo, patch: "img:bug")
    monkeypatch.setattr(builder, "_head_of", lambda client, image: "abc")
    monkeypatch.setattr(builder.audit, "audit_image", lambda client, rec: {"copies_of_the_fix": list(copies)})
    other: list[str] = []  # another leak of the image (git history, bytecode), as audit.problems words it

    def problems(found: dict[str, Any], rec: dict[str, Any]) -> list[str]:
        copies = found["copies_of_the_fix"]
        return ([f"the fixed code at {copies}"] if copies else []) + other

    monkeypatch.setattr(builder.audit, "problems", problems)
    logged: list[str] = []
    cfg = builder.BuildConfig(sdists=["pkg==1.0"], verify=False)
    search = builder._Search(fetch.SdistSpec.parse("pkg==1.0"), cfg, None, "img:repo", {}, [], logged.append)
    copies[:] = ["/testbed/pkg/core.py"]  # the fixed lines stand elsewhere in the buggy file itself
    assert search.finish(found) is None and "also stand elsewhere in pkg/core.py" in logged[-1]
    other[:] = ["unreachable git objects"]  # the same repeat, and the image leaks the fix another way: it fails
    with pytest.raises(builder.images.ImageBuildError, match="unreachable git objects"):
        search.finish(found)
    other[:] = []
    copies[:] = ["/opt/venv/lib/python3.11/site-packages/pkg/core.py"]  # a copy the recipe left: the build fails
    with pytest.raises(builder.images.ImageBuildError, match="lets the agent read the fix"):
        search.finish(found)
