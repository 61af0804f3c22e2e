"""What a person sees: a page of the Prefect or MLflow UI opened in headless Chromium (Debian's package, which
`make test` installs where it is missing), checked as rendered (headings, tables, images decoded and not blank, no
raw Markdown or HTML escapes) and kept as a screenshot for a person to look at."""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WIDTH = 1440  # the width people use: a laptop's browser window
SHOTS = Path(__file__).resolve().parents[1] / "build" / "ui-screenshots"
# what Markdown or HTML left unrendered looks like in a page's text
RAW = re.compile(r"^\s*#{1,6} |\|\s*---|!\[[^\]]*\]\(|\]\(data:|&lt;|&gt;|&amp;|&quot;|\*\*\w", re.M)


def browser():
    """A headless Chromium under Playwright (a context manager yielding the browser)."""
    from contextlib import contextmanager

    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium package where it is missing")

    @contextmanager
    def opened():
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                yield b
            finally:
                b.close()

    return opened()


def images(where, selector: str) -> list[dict]:
    """Every image of a page or frame that selector picks: whether it decoded, its size, and the spread of its pixels
    (0: one flat colour)."""
    import numpy as np
    from matplotlib.image import imread

    out = []
    for i, handle in enumerate(where.query_selector_all(selector)):
        info = handle.evaluate(
            "i => ({src: i.currentSrc.slice(0, 40), ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth})"
        )
        if info["ok"] and handle.is_visible():  # (a UI may keep a hidden copy of an image)
            handle.scroll_into_view_if_needed()
            info["spread"] = float(np.asarray(imread(io.BytesIO(handle.screenshot()), format="png")).std())
        out.append({"index": i, **info})
    return out


def check_page(
    page, name: str, headings: list[str], tables: int = 1, min_images: int = 1, selector: str = "img", frame=None
) -> str:
    """The rendered text of page (or of one of its frames: frame, a function of the page that returns it once it
    is there), once it holds every heading, at least `tables` tables and `min_images` images, every image decoded
    with pixels that vary, and no raw Markdown or HTML escapes in its text; a screenshot of the whole content kept
    as build/ui-screenshots/<name>.png."""
    where = page.main_frame if frame is None else _wait_for(page, frame, name)
    for heading in headings:
        where.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)
    if min_images:
        where.wait_for_selector(selector, timeout=60_000)
        where.wait_for_function(
            "s => [...document.querySelectorAll(s)].every(i => i.complete)", arg=selector, timeout=60_000
        )
    text = where.inner_text("body")
    assert len(where.query_selector_all("table")) >= tables, f"{name}: fewer than {tables} table(s) rendered"
    seen = images(where, selector)
    assert len([i for i in seen if "spread" in i]) >= min_images, f"{name}: images shown {seen}"
    broken = [i for i in seen if not i["ok"] or i.get("spread", 1.0) < 0.02]
    assert not broken, f"{name}: images not decoded or blank: {broken}"
    raw = RAW.findall(text)
    assert not raw, f"{name}: raw Markdown or HTML escapes show: {raw[:5]}"
    screenshot(page, name)
    return text


def screenshot(page, name: str) -> Path:
    """The page at the width people use, as tall as its tallest scrolling area (the UIs scroll inside a panel, which
    a full-page screenshot would cut at the window), as build/ui-screenshots/<name>.png."""
    tallest = page.evaluate(
        "Math.max(document.body.scrollHeight, ...[...document.querySelectorAll('*')]"
        ".filter(e => e.scrollHeight > e.clientHeight + 10).map(e => e.scrollHeight + e.getBoundingClientRect().top))"
    )
    page.set_viewport_size({"width": WIDTH, "height": int(min(max(tallest, 900), 12_000))})
    page.wait_for_timeout(500)
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": WIDTH, "height": 900})
    return path


def _wait_for(page, find, name: str, timeout_s: float = 60.0):
    """find(page) once it returns something (Playwright's own wait: a sleep here would stop its event loop)."""
    for _ in range(int(timeout_s * 4)):
        if (found := find(page)) is not None:
            return found
        page.wait_for_timeout(250)
    raise AssertionError(f"{name}: the frame never appeared")
