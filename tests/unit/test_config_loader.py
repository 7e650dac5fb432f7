"""The one config loader (sao.core.config): YAML, dotted overrides, aliases, typed fields, unknown keys refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from sao.core.config import ConfigError, apply_overrides, build, load_yaml, merge


@dataclass
class Inner:
    lam: float = 1.0
    kind: Literal["a", "b"] = "a"
    size: int | str = "1g"
    words: tuple[str, ...] = ()


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    steps: int = 1
    flag: bool = False
    name: str | None = None
    env: dict[str, str] = field(default_factory=dict)


ALIASES = {"inner.lambda": "inner.lam"}


def test_overrides_aliases_and_types() -> None:
    tree = apply_overrides({"steps": 3}, ["inner.lambda=1e-5", "flag=true", "inner.words=[x, y]", "name=7"])
    cfg = build(Outer, tree, aliases=ALIASES)
    assert cfg.inner.lam == pytest.approx(1e-5) and cfg.steps == 3 and cfg.flag is True
    assert cfg.inner.words == ("x", "y") and cfg.name == "7"
    assert build(Outer, {"inner": {"size": 512}}).inner.size == 512
    assert build(Outer, {"inner": {"size": "2g"}}).inner.size == "2g"
    assert build(Outer, {"env": {"A": 1}}).env == {"A": "1"}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"stpes": 1}, "unknown config key 'stpes'; did you mean steps?"),
        ({"inner": {"lma": 1}}, "unknown config key 'inner.lma'; did you mean inner.lam?"),
        ({"steps": "two"}, "steps: expected an integer, got 'two'"),
        ({"steps": True}, "steps: expected an integer, got True"),
        ({"flag": 1}, "flag: expected true or false, got 1"),
        ({"inner": {"kind": "c"}}, "inner.kind: expected one of ['a', 'b'], got 'c'"),
        ({"inner": {"size": True}}, "inner.size: expected an integer or a string, got True"),
        ({"inner": 3}, "inner: expected a mapping of fields, got 3"),
        ({"inner": {"words": ["x", False]}}, "inner.words[1]: expected a string, got False"),
    ],
)
def test_errors_name_the_key_and_what_was_expected(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Outer, data, aliases=ALIASES)
    assert needle in str(err.value)


def test_overrides_keep_the_input_and_refuse_bad_shapes() -> None:
    tree = {"inner": {"lam": 0.5}}
    out = apply_overrides(tree, ["inner.kind=b"])
    assert tree == {"inner": {"lam": 0.5}} and out == {"inner": {"lam": 0.5, "kind": "b"}}
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(tree, ["inner.kind"])
    with pytest.raises(ConfigError, match="'lam' is not a section"):
        apply_overrides(tree, ["inner.lam.x=1"])


def test_merge_is_deep_and_copies() -> None:
    base = {"a": {"b": 1, "c": [1]}, "d": 2}
    out = merge(base, {"a": {"b": 3}})
    out["a"]["c"].append(2)
    assert out == {"a": {"b": 3, "c": [1, 2]}, "d": 2} and base == {"a": {"b": 1, "c": [1]}, "d": 2}


def test_load_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found; pass --config"):
        load_yaml(tmp_path / "missing.yaml", "pass --config")
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_yaml(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_yaml(tmp_path / "empty.yaml") == {}
