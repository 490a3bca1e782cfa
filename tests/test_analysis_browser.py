"""The report renders in a real headless Chromium: no console errors, every image decodes.

Uses the system Chromium (Debian package ``chromium``) through Playwright's Python API;
``playwright install`` is never run, since nothing can be downloaded.  Without
/usr/bin/chromium the test is skipped locally but FAILS under CI (env var CI set), so
that a CI image that lost its browser cannot pass silently.  With DLCOMPARE_ARTIFACTS set
the screenshot is also kept as tests/artifacts/report.png.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from analysis import figures, report
from tests.test_analysis_data import make_campaign

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
pytestmark = pytest.mark.slow  # starts a browser

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "report.png"


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _require_browser():
    """Playwright's sync API, or skip (locally) / fail (CI) with the reason."""
    problem = None
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is absent (install the Debian package 'chromium')"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as exc:
            problem = f"the Python package playwright is missing: {exc}"
    if problem is None:
        return sync_playwright
    if _under_ci():
        pytest.fail(f"browser test cannot run under CI: {problem}")
    pytest.skip(problem)


def test_report_renders_in_headless_chromium(tmp_path):
    sync_playwright = _require_browser()
    out = make_campaign(tmp_path / "campaign")
    page_path = report.build_report(out)

    console_errors, page_errors, failed_requests = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.on("requestfailed", lambda req: failed_requests.append(req.url[:120]))
            page.goto(page_path.as_uri(), wait_until="load")
            images = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))")
            title = page.title()
            headings = page.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()

    if os.environ.get("DLCOMPARE_ARTIFACTS"):
        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, ARTIFACT)

    assert console_errors == [], console_errors
    assert page_errors == [], page_errors
    assert failed_requests == [], failed_requests
    assert len(images) == len(set(figures.FIGURES) - figures.OPTIONAL_FIGURES)
    for image in images:
        assert image["complete"] and image["width"] > 0, image
    assert "dlcompare report" in title
    assert {"How to read this", "Failures", "Environment"} <= set(headings)
    assert shot.stat().st_size > 10_000
