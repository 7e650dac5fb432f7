"""Pure parts of the sandboxes: output capping, exec stream framing, configs, image hashing."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sao.sandboxes.config import PoolConfig, SandboxConfig, parse_bytes
from sao.sandboxes.docker import _Framer, pump_frames
from sao.sandboxes.factory import sandbox_config_from_dict
from sao.sandboxes.images import ContextSource, _with_stopsignal, content_hash
from sao.sandboxes.output import OutputCapper, truncation_marker


def capped_reference(data: bytes, cap: int) -> bytes:
    """The obvious definition: everything if it fits, else head + marker + tail."""
    if len(data) <= cap:
        return data
    head = cap // 2
    return data[:head] + truncation_marker(len(data) - cap) + data[len(data) - (cap - head) :]


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(2, 200))
def test_capper_matches_reference(chunks: list[bytes], cap: int) -> None:
    c = OutputCapper(cap)
    for chunk in chunks:
        c.feed(chunk)
    data = b"".join(chunks)
    assert c.data() == capped_reference(data, cap)
    assert c.truncated == (len(data) > cap) and c.total == len(data)


def test_capper_memory_stays_bounded() -> None:
    c = OutputCapper(1000)
    for _ in range(10_000):
        c.feed(b"x" * 1000)
    assert len(c._head) + len(c._tail) <= 3 * 1000
    assert c.text().count("x") == 1000 and "9999000 bytes truncated" in c.text()


def test_capper_text_survives_cut_multibyte() -> None:
    c = OutputCapper(9)
    c.feed("ééééééééééé".encode())
    assert "truncated" in c.text()


def frames(payloads: list[tuple[int, bytes]]) -> bytes:
    return b"".join(struct.pack(">BxxxL", stream, len(p)) + p for stream, p in payloads)


def test_pump_frames_reassembles_split_frames() -> None:
    a, b = socket.socketpair()
    wire = frames([(1, b"hello "), (2, b"err "), (1, b"x" * 100_000), (1, b"")])

    def send() -> None:
        for i in range(0, len(wire), 7777):  # boundaries fall inside headers and payloads
            a.sendall(wire[i : i + 7777])
            time.sleep(0.001)
        a.close()

    t = threading.Thread(target=send)
    t.start()
    c = OutputCapper(1 << 20)
    assert pump_frames(b, _Framer(c), time.monotonic() + 10) is True
    t.join()
    assert c.data() == b"hello err " + b"x" * 100_000
    b.close()


def test_pump_frames_returns_false_at_deadline() -> None:
    a, b = socket.socketpair()
    a.sendall(frames([(1, b"partial")]))
    c = OutputCapper(100)
    t0 = time.monotonic()
    assert pump_frames(b, _Framer(c), t0 + 0.3) is False
    assert 0.25 < time.monotonic() - t0 < 2 and c.data() == b"partial"
    a.close()
    b.close()


def test_parse_bytes() -> None:
    assert parse_bytes("512m") == 512 << 20 and parse_bytes("2GiB") == 2 << 30 and parse_bytes(4096) == 4096
    with pytest.raises(ValueError, match=r"sandbox\.mem_limit"):
        parse_bytes("lots", "sandbox.mem_limit")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"backend": "podman"}, "sandbox.backend"),
        ({"mem_limit": "0"}, "sandbox.mem_limit"),
        ({"cpus": 0}, "sandbox.cpus"),
        ({"pids_limit": 2}, "sandbox.pids_limit"),
        ({"output_cap_bytes": 10}, "sandbox.output_cap_bytes"),
        ({"backend": "bwrap", "network": "bridge"}, "sandbox.network"),
        ({"shell": ()}, "sandbox.shell"),
        ({"workdir": "relative"}, "sandbox.workdir"),
        ({"user": "root"}, "sandbox.user"),
        ({"user": "0:0"}, "sandbox.user"),
        ({"user": "1000 1000"}, "sandbox.user"),
        ({"backend": "bwrap", "user": "nobody"}, "sandbox.user"),
        ({"disk_limit": "lots"}, "sandbox.disk_limit"),
        ({"disk_limit": 4096}, "sandbox.disk_limit"),
        ({"disk_check_s": 0}, "sandbox.disk_check_s"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SandboxConfig(**kwargs)  # type: ignore[arg-type]


def test_pool_config_and_from_dict() -> None:
    with pytest.raises(ValueError, match=r"pool\.max_concurrency"):
        PoolConfig(max_concurrency=0)
    cfg = sandbox_config_from_dict({"backend": "bwrap", "mem_limit": "1g", "shell": ["sh", "-c"]})
    assert cfg.mem_bytes == 1 << 30 and cfg.shell == ("sh", "-c")
    with pytest.raises(ValueError, match=r"unknown config key 'sandbox.memory' \(valid keys here: \['backend'"):
        sandbox_config_from_dict({"memory": "1g"})
    with pytest.raises(ValueError, match=r"unknown config key 'sandbox.mem_limt'; did you mean sandbox.mem_limit\?"):
        sandbox_config_from_dict({"mem_limt": "1g"})


def test_content_hash_follows_inputs(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    ctx: dict[str, ContextSource] = {"repo": tmp_path / "repo", "b.txt": b"b"}
    h = content_hash("FROM base\n", ctx)
    assert h == content_hash("FROM base\n", dict(reversed(list(ctx.items()))))  # order-free
    assert h != content_hash("FROM base2\n", ctx)
    assert h != content_hash("FROM base\n", {**ctx, "b.txt": b"c"})
    assert h != content_hash("FROM base\n", ctx, extra="sha256:other-base-id")
    (tmp_path / "repo" / "a.py").write_text("x = 2\n")
    assert h != content_hash("FROM base\n", ctx)
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    (tmp_path / "repo" / "a.py").chmod(0o755)
    assert h != content_hash("FROM base\n", ctx)  # executable bit counts


def test_stopsignal_added_once() -> None:
    assert _with_stopsignal("FROM x\n").endswith("STOPSIGNAL SIGKILL\n")
    assert _with_stopsignal("FROM x\nSTOPSIGNAL SIGTERM\n").count("STOPSIGNAL") == 1


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=50)), max_size=20), st.integers(1, 13))
def test_framer_any_split(payloads: list[tuple[int, bytes]], step: int) -> None:
    wire = frames(payloads)
    c = OutputCapper(1 << 20)
    f = _Framer(c)
    for i in range(0, len(wire), step):
        f.feed(wire[i : i + step])
    assert c.data() == b"".join(p for _, p in payloads)


def test_commands_default_to_an_unprivileged_user_and_a_disk_limit() -> None:
    cfg = SandboxConfig()
    assert cfg.user == "1000:1000" and cfg.disk_bytes == 1 << 30
    assert sandbox_config_from_dict({"disk_limit": "256m", "user": "nobody"}).disk_bytes == 256 << 20


class _Box:
    """What ``_DiskWatch.measured`` reads and writes of a sandbox; counts the kills it asks for."""

    def __init__(self, limit: int) -> None:
        self.cfg = SandboxConfig(disk_limit=limit)
        self.disk_baseline: int | None = None
        self.disk_killed_at: int | None = 0
        self.disk_size: int | None = None
        self.disk_kills = 0

    def _kill_all_blocking(self) -> None:
        pass


def test_disk_watch_kills_past_the_limit_only_while_growing() -> None:
    from sao.sandboxes.docker import _DiskWatch

    mib = 1 << 20
    box = _Box(10 * mib)
    sizes = [5, 12, 20, 22, 22, 15, 18, 23, 30]  # MiB of the writable layer at each measurement
    kills = []
    for size in sizes:
        _DiskWatch.measured(box, size * mib)  # type: ignore[arg-type]
        kills.append(box.disk_kills)
    # 5 is the baseline (what setup wrote); 20 is 15 past it: killed; 22 is what the killed writer left (no kill);
    # 22, 15, 18 do not grow past it; 23 does: killed; 30 is the next post-kill measurement.
    assert kills == [0, 0, 1, 1, 1, 1, 1, 2, 2]
    assert box.disk_size == 30 * mib


def test_disk_watch_trips_early_when_the_host_lost_more_than_the_sandboxes_may_still_write() -> None:
    from sao.sandboxes.docker import _DiskWatch

    mib, slack = 1 << 20, _DiskWatch.TRIP_SLACK
    fresh, half = _Box(100 * mib), _Box(100 * mib)  # never measured: all 100 MiB may be written
    for size in (10, 60):  # half: a 10 MiB baseline, 50 MiB written, 50 MiB of room left
        _DiskWatch.measured(half, size * mib)  # type: ignore[arg-type]
    boxes = [fresh, half]
    free0 = 10_000 * mib
    room = 150 * mib + slack
    assert not _DiskWatch.tripped(free0, free0 - room, boxes)  # type: ignore[arg-type]
    assert _DiskWatch.tripped(free0, free0 - room - 1, boxes)  # type: ignore[arg-type]
    # a sandbox past its limit has no room (not a negative one): the others' room and the slack remain
    over = _Box(10 * mib)
    for size in (0, 40):
        _DiskWatch.measured(over, size * mib)  # type: ignore[arg-type]
    assert _DiskWatch.tripped(free0, free0 - room - 1, [*boxes, over])  # type: ignore[arg-type]
    # without a local data directory (a remote daemon) nothing is known: only the period's query decides
    assert not _DiskWatch.tripped(None, free0 - 10**12, boxes)  # type: ignore[arg-type]
    assert not _DiskWatch.tripped(free0, None, boxes)  # type: ignore[arg-type]
