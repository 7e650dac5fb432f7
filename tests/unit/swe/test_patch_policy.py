"""The patch policy on crafted patches: source passes untouched, every way into the grading machinery is dropped with
its path and reason, and no reading of a header (quoted names, renames, traditional diffs, garbage) gets past it."""

from __future__ import annotations

import pytest

from sao.envs.swe.patch_policy import REASONS, apply_policy, path_kind

SOURCE = (
    "diff --git a/toolz/itertoolz.py b/toolz/itertoolz.py\nindex 1111111..2222222 100644\n--- a/toolz/itertoolz.py\n"
    "+++ b/toolz/itertoolz.py\n@@ -1,3 +1,3 @@\n def first(seq):\n-    return seq[1]\n+    return seq[0]\n \n"
)


def new_file(path: str, body: str = "x = 1\n", mode: str = "100644") -> str:
    lines = body.splitlines(keepends=True)
    added = "".join("+" + line for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\nindex 0000000..3333333\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{added}"
    )


def edit(path: str) -> str:
    return SOURCE.replace("toolz/itertoolz.py", path)


def test_source_passes_unchanged() -> None:
    new_module = new_file("toolz/sandbox/core2.py")
    for patch in (SOURCE, SOURCE + new_module, edit("six.py"), edit("setup.py")):
        result = apply_policy(patch)
        assert result.patch == patch and result.dropped == ()


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("toolz/tests/test_itertoolz.py", "tests"),
        ("tests/helpers.py", "tests"),
        ("pkg/testing/util.py", "tests"),
        ("test_x.py", "tests"),
        ("pkg/x_test.py", "tests"),
        ("pkg/tests.py", "tests"),
        ("conftest.py", "conftest"),
        ("toolz/conftest.py", "conftest"),
        ("pytest.ini", "test_config"),
        ("toolz/pytest.ini", "test_config"),
        (".pytest.ini", "test_config"),
        ("pytest.toml", "test_config"),
        ("tox.ini", "test_config"),
        ("setup.cfg", "test_config"),
        ("pyproject.toml", "test_config"),
        ("evil.pth", "startup_hook"),
        ("toolz/sitecustomize.py", "startup_hook"),
        ("usercustomize.py", "startup_hook"),
        ("toolz.egg-info/entry_points.txt", "package_metadata"),
        ("x.dist-info/METADATA", "package_metadata"),
        ("toolz/__pycache__/itertoolz.cpython-311.pyc", "compiled"),
        ("toolz/itertoolz.cpython-311-x86_64-linux-gnu.so", "compiled"),
        (".gitattributes", "git"),
        ("toolz/.gitattributes", "git"),
        (".gitmodules", "git"),
        ("../outside.py", "unsafe_path"),
    ],
)
def test_each_rule_drops_its_paths_edited_or_new(path: str, kind: str) -> None:
    assert path_kind(path) == kind
    for patch in (edit(path), new_file(path)):
        result = apply_policy(SOURCE + patch)
        assert result.patch == SOURCE, patch
        assert [(d.path, d.kind) for d in result.dropped] == [(path, kind)]
        assert result.report() == [{"path": path, "kind": kind, "reason": REASONS[kind]}]


def test_a_new_top_level_module_is_dropped_an_existing_one_is_source() -> None:
    for path in ("pytest.py", "my_plugin.py", "pytest/__init__.py"):
        result = apply_policy(new_file(path))
        assert result.patch == "" and result.dropped[0].kind == "new_top_level_module", path
    assert apply_policy(edit("pytest.py")).dropped == ()  # an existing root module (six.py) is the package
    assert apply_policy(new_file("toolz/newmod.py")).dropped == ()
    assert apply_policy(new_file("toolz/sub/__init__.py")).dropped == ()


def test_links_and_submodules_are_dropped() -> None:
    link = new_file("toolz/curried/linked.py", "../tests/test_x.py", mode="120000")
    gitlink = "diff --git a/vendor b/vendor\nnew file mode 160000\nindex 0000000..1234567\n--- /dev/null\n"
    gitlink += "+++ b/vendor\n@@ -0,0 +1 @@\n+Subproject commit 1234567890123456789012345678901234567890\n"
    for patch in (link, gitlink):
        result = apply_policy(SOURCE + patch)
        assert result.patch == SOURCE and [d.kind for d in result.dropped] == ["link"]


def test_both_sides_of_a_rename_or_copy_are_checked() -> None:
    for verb in ("rename", "copy"):
        into_tests = (
            f"diff --git a/toolz/x.py b/toolz/tests/conftest.py\nsimilarity index 100%\n"
            f"{verb} from toolz/x.py\n{verb} to toolz/tests/conftest.py\n"
        )
        out_of_tests = into_tests.replace("toolz/tests/conftest.py", "toolz/y.py").replace("toolz/x.py", "tests/a.py")
        for patch in (into_tests, out_of_tests):
            result = apply_policy(SOURCE + patch)
            assert result.patch == SOURCE and len(result.dropped) == 1, patch


def test_quoted_and_spaced_names_are_read_every_way() -> None:
    quoted = edit("toolz/itertoolz.py").replace("a/toolz/itertoolz.py", '"a/tests/\\303\\251.py"')
    assert [d.kind for d in apply_policy(quoted).dropped] == ["tests"]
    spaced = "diff --git a/x b/conftest.py b/x b/conftest.py\nold mode 100644\nnew mode 100755\n"
    assert [d.kind for d in apply_policy(spaced).dropped] == ["conftest"]


def test_a_traditional_diff_and_headers_without_a_prefix_are_checked() -> None:
    traditional = "--- conftest.py\t2020-01-01\n+++ conftest.py\t2020-01-01\n@@ -0,0 +1 @@\n+import os\n"
    assert apply_policy(traditional).patch == ""
    plain = "--- a/toolz/x.py\n+++ b/toolz/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert apply_policy(plain).patch == plain


def test_a_header_hidden_after_the_counted_hunk_is_its_own_section() -> None:
    hidden = SOURCE + "--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-assert 0\n+assert 1\n"
    result = apply_policy(hidden)
    assert result.patch == SOURCE and [d.path for d in result.dropped] == ["tests/test_x.py"]
    # lines inside a hunk that look like headers stay hunk lines: the counts decide, as in git apply
    inner = SOURCE.replace("@@ -1,3 +1,3 @@", "@@ -1,4 +1,4 @@").replace(" def first", "--- a/conftest.py\n def first")
    inner = inner.replace("--- a/conftest.py", " --- a/conftest.py")
    assert apply_policy(inner).patch == inner


def test_garbage_and_other_formats_never_reach_the_grader() -> None:
    context_diff = "*** conftest.py\n--- conftest.py\n***************\n*** 0 ****\n--- 1 ----\n+ import os\n"
    result = apply_policy("Some commit message\n" + SOURCE + "trailing words\n" + context_diff)
    assert result.patch == SOURCE


def test_a_binary_section_is_kept_or_dropped_whole() -> None:
    binary = (
        "diff --git a/toolz/data.bin b/toolz/data.bin\nnew file mode 100644\nindex 0000000..aaaaaaa\n"
        "GIT binary patch\nliteral 3\nKcmZQzWB>pF00030\n\nliteral 0\nHcmV?d00001\n\n"
    )
    assert apply_policy(binary + SOURCE).patch == binary + SOURCE
    bad = binary.replace("toolz/data.bin", "toolz/x.cpython-311.pyc")
    result = apply_policy(bad + SOURCE)
    assert result.patch == SOURCE and [d.kind for d in result.dropped] == ["compiled"]


def test_only_dropped_sections_leave_an_empty_patch() -> None:
    result = apply_policy(new_file("conftest.py") + new_file("pytest.ini"))
    assert result.patch == "" and result.sections == 2 and len(result.dropped) == 2


def test_git_reads_the_kept_patch_too_and_a_misreading_grades_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sao.envs.swe.patch_policy as policy

    rename = "diff --git a/x.py b/toolz/y.py\nsimilarity index 100%\nrename from x.py\nrename to toolz/y.py\n"
    assert policy.git_apply_paths(SOURCE + rename) == ["toolz/itertoolz.py", "toolz/y.py"]
    assert policy.git_apply_paths("not a patch\n") is None
    # a policy whose own reading misses a conftest (as a parser bug would): git's reading of the kept patch catches it
    monkeypatch.setattr(policy, "_section_kind", lambda sec: None)
    result = apply_policy(SOURCE + new_file("conftest.py"))
    assert result.patch == "" and [(d.path, d.kind) for d in result.dropped] == [("conftest.py", "misread")]


def test_tampering_is_flagged_not_judged() -> None:
    """The gap the rules cannot close (library code run by the grader's pytest) gets a detector, not a verdict."""
    tamper = new_file(
        "toolz/_speedups.py",
        "import atexit, sys\nsys.modules['pytest'].main = None\natexit.register(lambda: print('PASSED t::x'))\nx = 1\n",
    )
    result = apply_policy(SOURCE + tamper)
    assert result.patch == SOURCE + tamper and result.dropped == ()
    assert result.signals == (
        "+import atexit, sys",
        "+sys.modules['pytest'].main = None",
        "+atexit.register(lambda: print('PASSED t::x'))",
    )
    assert apply_policy(SOURCE).signals == ()
    assert apply_policy(new_file("conftest.py", "import pytest\n")).signals == ()  # dropped: nothing to flag
