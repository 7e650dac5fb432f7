"""The one registry shape (sao.core.registry): a taken name refused, an unknown one answered with the nearest."""

from __future__ import annotations

import pytest

from sao.core.registry import Registry, unknown_name


def test_register_lookup_and_list() -> None:
    reg: Registry[str] = Registry("thing", describe=str.upper)
    reg.add("beta", "b")

    @reg.register("alpha")
    def _alpha() -> None: ...

    assert reg.names() == ["beta", "alpha"] and "alpha" in reg and reg.get("beta") == "b"  # registration order
    with pytest.raises(ValueError, match=r"thing 'beta' is already registered \(B\); pick another name"):
        reg.add("beta", "other")
    assert reg.get("beta") == "b"  # the refused entry did not replace it
    with pytest.raises(ValueError, match=r"unknown thing 'alpah' \(did you mean 'alpha'\?\); registered: beta, alpha"):
        reg.get("alpah")
    with pytest.raises(ValueError, match=r"unknown thing 'zzz'; registered: beta, alpha"):
        reg.get("zzz")
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", "x")


def test_unknown_name_without_entries() -> None:
    assert unknown_name("engine", "vlm", []) == "unknown engine 'vlm'; registered: "
