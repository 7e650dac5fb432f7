"""Pure parts of the task builder: which test files a mutation is validated on, and the candidate order."""

from __future__ import annotations

import pytest

from envs.swe.tasks.builder import BuildConfig, _candidates, _relevant_tests
from envs.swe.tasks.mutations import Mutation

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
