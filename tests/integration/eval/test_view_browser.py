"""`sao view` in a real browser: a toy training run with per-token records, the page served by the real CLI, driven
in headless Debian Chromium through Selenium and chromedriver. ``SAO_VIEW_SCREENSHOTS=DIR`` keeps the screenshots
(docs/img/view_*.png are taken this way)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._cli_env import cli_env
from tests._require import missing
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--window-size=1400,1000")  # fmt: skip

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 steps of the toy job (8 episodes a step), 4 of them recorded per token each step (~20 s)."""
    run = tmp_path_factory.mktemp("view") / "toy"
    args = ["configs/toy.yaml", f"run.dir={run}", "run.total_steps=4", "trainer.token_records=4",
            "trainer.batch_size=8", "deepspeed.micro_batch_size=8", "rollout.concurrency=8", "rollout.buffer_size=8",
            "trainer.skip_uniform_reward_batches=false", "run.progress=false", "run.plot=false",
            "run.tensorboard=false"]  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "sao.cli.main", "train", *args], cwd=ROOT, env=cli_env(),
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def view_url(toy_run: Path) -> Iterator[str]:
    """`sao view` on the toy run, as a user starts it; its URL as it printed it."""
    cmd = [sys.executable, "-m", "sao.cli.main", "view", str(toy_run), "--port", str(free_port())]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert m, f"`sao view` printed no URL: {line!r}"
        url = m.group(0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "api/run", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail(f"`sao view` did not answer at {url} in 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing("Chromium and chromedriver", "run `python -m sao.core.setup browser` (apt: chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    d = webdriver.Chrome(options=opts, service=Service(driver))
    try:
        yield d
    finally:
        d.quit()


def _ledger(run: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in lines if r.get("type") == "trajectory"]


def _shot(d: Any, name: str, tmp: Path) -> None:
    folder = Path(os.environ.get("SAO_VIEW_SCREENSHOTS") or tmp)
    folder.mkdir(parents=True, exist_ok=True)
    d.save_screenshot(str(folder / f"view_{name}.png"))


def test_the_page_shows_steps_filters_episodes_and_token_overlays(
    toy_run: Path, view_url: str, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    d, wait = browser, WebDriverWait(browser, 60)
    rows = lambda: d.find_elements(By.CSS_SELECTOR, "#ep-table tbody tr")  # noqa: E731

    def shown(ending: str, recorded: bool = False) -> str:
        """The list's count line once the page shows the answer to this filter (not an earlier one's)."""

        def ready(d: Any) -> str | None:
            count = d.find_element(By.ID, "ep-count")
            q = json.loads(count.get_attribute("data-query") or "{}")
            return count.text if q.get("ending") == ending and q.get("recorded") == recorded else None

        return str(wait.until(ready))

    d.get(view_url)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#step-table tr[data-step]")) == 4)
    assert len(d.find_elements(By.CSS_SELECTOR, "#charts .uplot")) >= 5, "the metrics charts were not drawn"
    _shot(d, "overview", tmp_path)

    ledger = _ledger(toy_run)
    d.find_element(By.ID, "tab-episodes").click()
    assert shown("").startswith(f"{len(ledger)} episodes match")
    # filter by how episodes ended: every row shown is ok, as many as the ledger holds; none was truncated
    Select(d.find_element(By.ID, "f-ending")).select_by_value("ok")
    assert shown("ok").startswith(f"{sum(r['status'] == 'ok' for r in ledger)} episodes match")
    assert {c.text for c in d.find_elements(By.CSS_SELECTOR, "#ep-table td.ending")} == {"ok"}
    Select(d.find_element(By.ID, "f-ending")).select_by_value("truncated")
    assert shown("truncated").startswith("0 episodes match") and not rows()
    Select(d.find_element(By.ID, "f-ending")).select_by_value("")
    d.find_element(By.ID, "f-recorded").click()  # the 4 x 4 episodes with per-token records
    assert shown("", recorded=True).startswith("16 episodes match")
    _shot(d, "episodes", tmp_path)

    first = rows()[0]
    line = int(first.get_attribute("data-line"))
    uid = _uid_at_line(toy_run, line)
    recs = [json.loads(x) for x in (toy_run / "token_records.jsonl").read_text().splitlines()]
    rec = next(r for r in recs if r["uid"] == uid)
    first.click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#conversation .tok.action"))
    kinds = {el.get_attribute("class").split()[1] for el in d.find_elements(By.CSS_SELECTOR, "#conversation .tok")}
    assert kinds == {"prompt", "action", "observation"}, kinds
    Select(d.find_element(By.ID, "overlay")).select_by_value("advantage")
    wait.until(lambda d: "advantage at step" in d.find_element(By.ID, "legend").text)
    toks = d.find_elements(By.CSS_SELECTOR, "#conversation .tok.action")
    assert len(toks) == len(rec["advantage"])
    for el, adv in zip(toks, rec["advantage"], strict=True):
        assert "background" in (el.get_attribute("style") or ""), "the advantage overlay left a token uncoloured"
        assert f"advantage {adv:.4f}" in el.get_attribute("title")
    _shot(d, "episode", tmp_path)
    Select(d.find_element(By.ID, "overlay")).select_by_value("ratio")
    masked = len(rec["mask"].replace("k", ""))
    wait.until(lambda d: f"{masked} of {len(rec['mask'])} masked" in d.find_element(By.ID, "legend").text)


def _uid_at_line(run: Path, line: int) -> str:
    """The ledger uid of the ``line``-th JSON line of trajectories.jsonl (the page's episode number)."""
    lines = [x for x in (run / "trajectories.jsonl").read_text().splitlines() if x.strip()]
    return str(json.loads(lines[line])["uid"])
