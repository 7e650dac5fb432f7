"""Build guard: the ``sao`` namespace holds five packages that git stores as symlinks (sao/agent -> ../agent, ...).
A clone made with ``core.symlinks=false`` checks them out as small text files, and setuptools would then build a wheel
without those packages and no error. Refuse the build (wheel, sdist and editable install alike) instead."""

from pathlib import Path

from setuptools import setup

LINKED = ("agent", "benchmarks", "envs", "sandboxes", "trainer")


def missing_linked_packages(root: Path) -> list[str]:
    """The linked packages of ``root/sao`` that are not a folder with an ``__init__.py``."""
    return [name for name in LINKED if not (root / "sao" / name / "__init__.py").is_file()]


missing = missing_linked_packages(Path(__file__).resolve().parent)
if missing:
    raise SystemExit(
        "sao build refused: sao/" + ", sao/".join(missing) + " is not a package folder. These are git symlinks "
        "(sao/agent -> ../agent, ...) and this checkout has them as plain files, which happens when git runs with "
        "core.symlinks=false (e.g. on Windows). Fix: `git config core.symlinks true && git checkout -- sao`, or "
        "clone again with `git clone -c core.symlinks=true ...`."
    )

setup()
