"""Take the graded patch from the agent's repository with a git the agent cannot configure: what is graded is on disk.

The agent owns ``/testbed`` and its ``.git``: its config (``diff.external``, ``core.attributesFile``,
``core.hooksPath``, ``core.fsmonitor``, filters), its ``.gitattributes`` (diff drivers, ``textconv``, ``filter``,
``eol``, ``working-tree-encoding``), its hooks, its index, its HEAD and refs. Any of them decides what a
``git diff`` run in that repository prints, so the patch is taken outside all of them:

- ``keep_base`` (once, at the start of the episode, before the agent's first command): root copies ``/testbed/.git``
  into ``BASE_DIR`` (mode 0700, root's: the agent can neither read nor change it) and records the tree of ``HEAD``.
  The base is then fixed: a rewritten HEAD, a deleted ``.git``, a stale ``index.lock`` change nothing.
- ``take_patch`` (when the episode ends): root, with an empty environment (``env -i``: no ``HOME``, no
  ``GIT_*`` of the agent, ``GIT_CONFIG_NOSYSTEM`` / ``GIT_CONFIG_GLOBAL=/dev/null``), in a fresh ``GIT_DIR`` of its
  own (no config beyond ``git init``'s, no hooks, ``core.hooksPath=/dev/null``, no fsmonitor), reads the base tree
  into a fresh index, adds the working tree (``add -A``: the agent's ``.gitignore`` still applies, which can only hide
  the agent's own changes), and prints ``diff --cached --binary --no-ext-diff --no-textconv --no-renames`` against
  the base tree. ``$GIT_DIR/info/attributes``, which outranks every ``.gitattributes``, sets ``text``, ``eol``,
  ``crlf``, ``ident``, ``filter``, ``working-tree-encoding`` and ``diff`` to unspecified: no conversion on the way in,
  no driver on the way out (``--attr-source`` would say it more directly but needs git 2.40; official images have
  2.34; ``core.fsmonitor=`` is empty, not ``false``, which git before 2.36 would run as a hook). Root here has no
  ``DAC_OVERRIDE``: a file the agent made unreadable stops the take.

What the agent can still cause is its own failure, not an infra error (``BrokenRepoError``: the grade is unresolved
with the reason): a working tree git cannot read (unreadable files, ``/testbed`` gone, a FIFO where a file was), one
too large to take in ``TAKE_TIMEOUT_S``, a patch over ``read_limit_bytes``.
"""

from __future__ import annotations

import errno
import shlex

from sao.envs.swe.grading import REPO_DIR
from sao.sandboxes.protocols import RootCommands, Sandbox, SandboxError

BASE_DIR = "/var/lib/sao-grade"
TAKE_TIMEOUT_S = 300
_CLEAN_ENV = (
    "env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1",
    "GIT_CONFIG_GLOBAL=/dev/null", "GIT_ATTR_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C",
)  # fmt: skip
_GIT = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor= -c core.untrackedCache=false -c core.fileMode=false "
    "-c core.autocrlf=false -c core.safecrlf=false -c core.symlinks=true -c core.quotePath=true"
)
KEEP_BASE = f"""set -eu
base={BASE_DIR}
rm -rf "$base"
mkdir -p "$(dirname "$base")"
mkdir -m 700 "$base"
cp -R {REPO_DIR}/.git "$base/base.git"
rm -rf "$base/base.git/hooks"
git --git-dir="$base/base.git" rev-parse --verify 'HEAD^{{tree}}' > "$base/tree"
"""
# Exit codes: 0 the patch is in $take/patch; 3 our own base is unusable (infra); 4 git could not read the working
# tree, 137 the take ran past its timeout (both the agent's doing).
TAKE_PATCH = f"""set -u
base={BASE_DIR}
take="$base/take"
tree=$(cat "$base/tree") || exit 3
rm -rf "$take" && mkdir -m 700 "$take" || exit 3
export GIT_DIR="$take/git" GIT_WORK_TREE={REPO_DIR} GIT_INDEX_FILE="$take/index"
export GIT_ALTERNATE_OBJECT_DIRECTORIES="$base/base.git/objects"
git init -q --template= "$GIT_DIR" && mkdir "$GIT_DIR/info" || exit 3
printf '* !text !eol !crlf !ident !filter !working-tree-encoding !diff\\n' > "$GIT_DIR/info/attributes" || exit 3
{_GIT} read-tree "$tree" || exit 3
cd {REPO_DIR} || exit 4
timeout -s KILL "$1" {_GIT} add -A || exit $(( $? == 137 ? 137 : 4 ))
{_GIT} diff --cached --binary --no-ext-diff --no-textconv --no-color --no-renames "$tree" > "$take/patch" || exit 4
"""
PATCH_PATH = f"{BASE_DIR}/take/patch"


class BrokenRepoError(Exception):
    """The agent left a repository the patch cannot be taken from: an unresolved grade, this message its reason."""


def _root(sb: Sandbox) -> RootCommands:
    if not isinstance(sb, RootCommands):
        raise SandboxError(f"the SWE env needs a sandbox that runs root's steps (Docker), got {type(sb).__name__}")
    return sb


async def keep_base(sb: Sandbox) -> None:
    """Keep the repository's base out of the agent's reach (see the module docstring); before the agent acts."""
    code, out = await _root(sb).exec_as_root([*_CLEAN_ENV, "sh", "-c", KEEP_BASE], timeout=600)
    if code != 0:
        raise SandboxError(f"could not keep the base of {REPO_DIR} for grading (exit {code}): {out[-500:]}")


async def take_patch(sb: Sandbox, timeout_s: float = TAKE_TIMEOUT_S) -> str:
    """The working tree's changes against the kept base, as a binary git patch (see the module docstring)."""
    argv = [*_CLEAN_ENV, "sh", "-c", TAKE_PATCH, "take", str(int(timeout_s))]
    code, out = await _root(sb).exec_as_root(argv, timeout=timeout_s + 120)
    if code == 137:
        raise BrokenRepoError(f"taking the patch of {REPO_DIR} ran past {int(timeout_s)} s (is the working tree huge?)")
    if code == 4:
        raise BrokenRepoError(f"git could not read the working tree of {REPO_DIR}: {out.strip()[-400:]}")
    if code != 0:
        raise SandboxError(f"could not take the patch of {REPO_DIR} (exit {code}): {out[-500:]}")
    try:
        return await sb.read_file(PATCH_PATH)
    except OSError as e:
        if e.errno == errno.EFBIG:
            raise BrokenRepoError(f"the patch is over sandbox.read_limit_bytes: {e}") from e
        raise SandboxError(f"could not read the taken patch {shlex.quote(PATCH_PATH)}: {e}") from e
