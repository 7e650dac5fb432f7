"""Audit of a built SWE task image: can the agent read the fix instead of finding it? (``audit_image``)

Run inside a fresh container of the image, as the agent would see it. By content, never by name: what leaks is the
fixed code, wherever it sits and whatever the file is called.
- git: HEAD is ``base_commit``, one commit, one ref, no reflog or stash, no unreachable object, no object holding a
  fixed file (the post-image blob ids of the gold patch);
- text: every file of the image (``/testbed`` included, ``.git`` left to the git checks) is searched for each
  hunk of the fix as it reads after the fix (its context and added lines, whitespace-normalised, in order): a copy
  in another site-packages, a cache, a vendored or renamed copy is refused; an unrelated module of the same name
  (the standard library's ``encodings/idna.py`` for idna) or a console-script launcher holds none of it;
- archives: every zip (wheel, egg, jar) and tar (``.tar.gz``, sdists) found by its magic bytes, whatever its name,
  is opened and its members searched the same way;
- bytecode: every ``.pyc`` of the image's Python is loaded and its code objects compared (bytecode, constants and
  names; not file names or line numbers) with those only the fixed source compiles to: stale bytecode of a
  mutated file is refused, the buggy file's own bytecode is not.
The builder runs it on every task image it makes and refuses a leaky one; ``tests/integration/swe/
test_task_integrity.py`` runs it on the test task set and on a deliberately leaky image.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sao.sandboxes.docker import tar_one

# Run with python3 in /testbed, the gold patch at /tmp/gold.diff; prints one JSON object.
AUDIT = r'''
import importlib.util, io, json, marshal, os, stat, subprocess, sys, tarfile, types, zipfile

MAX_BYTES = 64 << 20
SKIP = {"/proc", "/sys", "/dev", "/run", "/testbed/.git"}
OURS = {"/tmp/gold.diff", "/tmp/sao_audit.py"}


def git(*a):
    return subprocess.run(["git", *a], capture_output=True, text=True)


os.chdir("/testbed")
files = [ln.split("\t")[2] for ln in git("apply", "--numstat", "/tmp/gold.diff").stdout.splitlines() if ln]
buggy = {f: open(f, "rb").read() for f in files if os.path.isfile(f)}
if git("apply", "/tmp/gold.diff").returncode != 0:
    print(json.dumps({"apply_failed": True}))
    sys.exit(0)
fixed = {f: open(f, "rb").read() for f in files if os.path.isfile(f)}
post_ids = [git("hash-object", f).stdout.strip() for f in fixed]
git("checkout", "-q", "--", ".")
git("clean", "-fdq")
in_store = [i for i in post_ids if git("cat-file", "-e", i).returncode == 0]

# The fix's hunks as they read after it: context and added lines, stripped, blank lines dropped.
needles, hunk, added = [], None, False
for line in open("/tmp/gold.diff", encoding="utf-8", errors="replace").read().splitlines():
    if line.startswith("diff --git") or line.startswith("@@"):
        if hunk and added:
            needles.append(hunk)
        hunk, added = ([] if line.startswith("@@") else None), False
    elif hunk is not None and line[:1] in (" ", "+"):
        if line[1:].strip():
            hunk.append(line[1:].strip())
        added = added or line[:1] == "+"
if hunk and added:
    needles.append(hunk)
keys = [max(n, key=len).encode() for n in needles]


def holds_fix(data):
    hits = [needle for key, needle in zip(keys, needles) if key in data]
    if not hits:
        return False
    text = data.decode("utf-8", errors="replace")
    for needle in hits:
        lines = [s for s in (ln.strip() for ln in text.splitlines()) if s]
        first, n = needle[0], len(needle)
        if any(lines[i : i + n] == needle for i, s in enumerate(lines) if s == first):
            return True
    return False


def signatures(code):
    out, todo = set(), [code]
    while todo:
        c = todo.pop()
        inner = [k for k in c.co_consts if isinstance(k, types.CodeType)]
        consts = tuple(repr(k) for k in c.co_consts if not isinstance(k, types.CodeType))
        out.add((getattr(c, "co_qualname", c.co_name), c.co_code, consts, c.co_names))
        todo += inner
    return out


def compiled(src, path):
    try:
        return signatures(compile(src, path, "exec"))
    except (SyntaxError, ValueError):
        return set()


fixed_code = set()
for f, src in fixed.items():
    if f.endswith(".py"):
        fixed_code |= compiled(src, f) - compiled(buggy.get(f, b""), f)


def members(data):
    """(name, bytes) of the files of a zip or tar archive held in ``data``; none if it is neither."""
    try:
        if data[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    if not info.is_dir() and info.file_size <= MAX_BYTES:
                        yield info.filename, z.read(info)
        elif data[:2] in (b"\x1f\x8b", b"BZ") or data[:6] == b"\xfd7zXZ\x00" or data[257:262] == b"ustar":
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                for m in t:
                    if m.isfile() and m.size <= MAX_BYTES:
                        yield m.name, t.extractfile(m).read()
    except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError):
        return


def bytecode_of_fix(data):
    if not fixed_code or data[:4] != importlib.util.MAGIC_NUMBER:
        return False
    try:
        return bool(signatures(marshal.loads(data[16:])) & fixed_code)
    except (ValueError, EOFError, TypeError):
        return False


copies, pyc, scanned = [], [], 0
for root, dirs, names in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP]
    for name in names:
        p = os.path.join(root, name)
        if p in OURS:
            continue
        try:
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                continue
            data = open(p, "rb").read()
        except OSError:
            continue
        scanned += 1
        if bytecode_of_fix(data):
            pyc.append(p)
        elif holds_fix(data):
            copies.append(p)
        else:
            copies += [f"{p}!{m}" for m, body in members(data) if holds_fix(body) or bytecode_of_fix(body)]

refs = git("for-each-ref", "--format=%(refname)").stdout.split()
fsck = git("fsck", "--unreachable", "--no-reflogs", "--no-progress")
print(json.dumps({
    "head": git("rev-parse", "HEAD").stdout.strip(),
    "commits_all": len(git("rev-list", "--all").stdout.split()),
    "refs": refs,
    "reflog_entries": len(git("reflog", "show", "--format=%H").stdout.split()),
    "stash": len(git("stash", "list").stdout.splitlines()),
    "logs_dir": os.path.exists(".git/logs"),
    "post_image_ids_in_store": in_store,
    "unreachable_objects": (fsck.stdout + fsck.stderr).count("unreachable"),
    "fix_hunks": len(needles),
    "fixed_code_objects": len(fixed_code),
    "files_scanned": scanned,
    "copies_of_the_fix": copies,
    "bytecode_of_the_fix": pyc,
}))
'''


def audit_image(client: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Run ``AUDIT`` in a fresh container of ``task["image"]`` (a record of ours) and return its findings."""
    container = client.containers.run(
        task["image"],
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels={"sao.owner_pid": str(os.getpid()), "sao.role": "swe-task-audit"},
    )
    try:
        patch = task["patch"] if task["patch"].endswith("\n") else task["patch"] + "\n"
        for name, data in (("gold.diff", patch.encode()), ("sao_audit.py", AUDIT.encode())):
            if not container.put_archive("/tmp", tar_one(name, data)):
                raise RuntimeError(f"could not copy {name} into a container of {task['image']}")
        res = container.exec_run(["python3", "/tmp/sao_audit.py"], workdir="/testbed")
        out = res.output.decode(errors="replace")
        last = out.strip().splitlines()[-1] if out.strip() else ""
        if not last.startswith("{"):
            raise RuntimeError(f"the audit script failed in {task['image']} (exit {res.exit_code}):\n{out[-2000:]}")
        return dict(json.loads(last))
    finally:
        container.remove(force=True)


def problems(found: dict[str, Any], task: dict[str, Any]) -> list[str]:
    """What in ``found`` (``audit_image``) would let the agent read the fix; empty for a clean image."""
    if found.get("apply_failed"):
        return ["the gold patch does not apply to the image's /testbed"]
    checks = [
        (found["head"] == task["base_commit"], f"HEAD {found['head']} is not base_commit {task['base_commit']}"),
        (found["commits_all"] == 1, f"{found['commits_all']} commits reachable (git log --all)"),
        (found["refs"] == ["refs/heads/main"], f"refs {found['refs']}"),
        (found["reflog_entries"] == 0 and not found["logs_dir"], "a reflog"),
        (found["stash"] == 0, "a stash"),
        (not found["post_image_ids_in_store"], f"fixed blobs in the object store {found['post_image_ids_in_store']}"),
        (found["unreachable_objects"] == 0, f"{found['unreachable_objects']} unreachable objects"),
        (found["fix_hunks"] > 0, "the gold patch has no hunk to search for"),
        (not found["copies_of_the_fix"], f"the fixed code at {found['copies_of_the_fix']}"),
        (not found["bytecode_of_the_fix"], f"bytecode of the fixed code at {found['bytecode_of_the_fix']}"),
    ]
    return [msg for ok, msg in checks if not ok]
