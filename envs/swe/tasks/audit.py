"""Audit of a built SWE task image: can the agent read the fix instead of finding it? (``audit_task_image``)

Run inside a fresh container of the image, as the agent would see it: git history, refs, reflog, stash; objects in
the store holding a fixed file (the gold patch's post-image blob ids); unreachable objects; a copy of a fixed file
anywhere in the image; the package's own wheel / sdist / zip / egg anywhere; other copies of the package's top-level
module (vendored by pip, setuptools, ...); bytecode in ``/testbed``; ``/wheels`` and pip's cache. The builder runs it
on every task image it makes and refuses a leaky one; ``tests/integration/swe/test_task_integrity.py`` runs it on
the test task set and on a deliberately leaky image.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from sandboxes.docker import tar_one

# Run in /testbed with the gold patch at /tmp/gold.diff; prints one JSON object.
AUDIT = r"""
set -u
cd /testbed
files=$(git apply --numstat /tmp/gold.diff | cut -f3)
git apply /tmp/gold.diff || { echo '{"apply_failed": true}'; exit 0; }
post_ids=""; post_sha=""
for f in $files; do
  post_ids="$post_ids $(git hash-object "$f")"
  post_sha="$post_sha $(sha256sum "$f" | cut -d' ' -f1):$(basename "$f")"
done
git checkout -q -- . && git clean -fdq
in_store=""
for id in $post_ids; do git cat-file -e "$id" 2>/dev/null && in_store="$in_store $id"; done
for id in $(sed -n 's/^index [0-9a-f]*\.\.\([0-9a-f]*\).*/\1/p' /tmp/gold.diff); do
  git cat-file -e "$id" 2>/dev/null && in_store="$in_store $id"
done
copies=""
for pair in $post_sha; do
  sha=${pair%%:*}; name=${pair#*:}
  for p in $(find / -xdev -type f -name "$name" 2>/dev/null); do
    [ "$(sha256sum "$p" | cut -d' ' -f1)" = "$sha" ] && copies="$copies $p"
  done
done
archives=$(find / -xdev -type f \( -iname "$PKG_A-*.whl" -o -iname "$PKG_B-*.whl" -o -iname "$PKG_A-*.tar.gz" \
  -o -iname "$PKG_B-*.tar.gz" -o -iname "$PKG_A-*.zip" -o -iname "$PKG_B-*.zip" -o -iname "$PKG_A-*.egg" \) \
  2>/dev/null | tr '\n' ' ')
vendored=$(for m in $MODS; do find / -xdev -path /testbed -prune -o \( -name "$m" -o -name "$m.py" \) -print; done \
  2>/dev/null | tr '\n' ' ')
unreachable=$(git fsck --unreachable --no-reflogs --no-progress 2>&1 | grep -c unreachable)
python3 - "$in_store" "$copies" "$archives" "$unreachable" "$vendored" <<'EOF'
import json, os, subprocess, sys
def git(*a):
    return subprocess.run(["git", *a], capture_output=True, text=True).stdout.split()
print(json.dumps({
    "head": git("rev-parse", "HEAD")[0],
    "commits_all": len(git("rev-list", "--all")),
    "refs": git("for-each-ref", "--format=%(refname)"),
    "reflog_entries": len(git("reflog", "show", "--format=%H")),
    "stash": len(git("stash", "list")),
    "logs_dir": os.path.exists(".git/logs"),
    "post_image_ids_in_store": sys.argv[1].split(),
    "copies_of_fixed_files": sys.argv[2].split(),
    "package_archives": sys.argv[3].split(),
    "unreachable_objects": int(sys.argv[4] or 0),
    "other_copies_of_its_modules": sys.argv[5].split(),
    "pyc_in_testbed": len([1 for r, _, fs in os.walk("/testbed") for f in fs if f.endswith(".pyc")]),
    "wheels_dir": os.path.exists("/wheels"),
    "pip_cache": os.path.exists("/root/.cache/pip"),
}))
EOF
"""


def module_of(task: dict[str, Any]) -> str:
    """The top-level import name holding the mutated file (``toolz/itertoolz.py`` -> ``toolz``)."""
    parts = str(task["sao_mutation"]["path"]).split("/")
    parts = parts[1:] if parts[0] == "src" else parts
    return parts[0].removesuffix(".py")


def audit_image(client: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Run ``AUDIT`` in a fresh container of ``task["image"]`` (a record of ours) and return its findings."""
    package = task["repo"].split("/", 1)[1]
    container = client.containers.run(
        task["image"],
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels={"sao.owner_pid": str(os.getpid()), "sao.role": "swe-task-audit"},
    )
    try:
        patch = task["patch"] if task["patch"].endswith("\n") else task["patch"] + "\n"
        if not container.put_archive("/tmp", tar_one("gold.diff", patch.encode())):
            raise RuntimeError(f"could not copy the gold patch into a container of {task['image']}")
        env = {"PKG_A": package, "PKG_B": re.sub(r"[-_.]+", "_", package), "MODS": module_of(task)}
        res = container.exec_run(["bash", "-c", AUDIT], environment=env, workdir="/testbed")
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
        (not found["copies_of_fixed_files"], f"copies of the fixed files at {found['copies_of_fixed_files']}"),
        (not found["package_archives"], f"archives of the package at {found['package_archives']}"),
        (
            not found["other_copies_of_its_modules"],
            f"other copies of its module {found['other_copies_of_its_modules']}",
        ),
        (found["pyc_in_testbed"] == 0, "bytecode in /testbed"),
        (not found["wheels_dir"] and not found["pip_cache"], "/wheels or pip's cache"),
    ]
    return [msg for ok, msg in checks if not ok]
