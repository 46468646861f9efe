"""The documentation site builds with warnings as errors and renders in a real browser.

The site is built into a temporary folder (`mkdocs build --strict`, which also writes the
generated reference), served over HTTP on loopback, and opened in headless Chromium: the
rendered DOM of the home page and of `hpo study`'s reference page, and a screenshot of each.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.cli import ROOT

# Material's default header colour (indigo, #4051b5): seen only when the theme's CSS loaded.
HEADER_RGB = np.array([0x40, 0x51, 0xB5]) / 255


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass


def chromium(url: str, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is not installed: run `bash scripts/ensure-chromium.sh`"
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=1400,900", "--virtual-time-budget=5000", *mode, url],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("", ("Getting started", "LoRA fine-tuning configurations")),
        ("reference/study/", ("--trial-fraction", "Successive halving in data fraction")),
    ],
)
def test_a_page_renders_in_headless_chromium(
    served: str, tmp_path: Path, page: str, expected: tuple[str, ...]
) -> None:
    from matplotlib.image import imread

    url = f"{served}/{page}"
    dom = chromium(url, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert (
        "<title>" in dom.stdout
        and " - hpo</title>" in dom.stdout
        or "<title>hpo</title>" in dom.stdout
    )
    for text in expected:
        assert text in dom.stdout, f"{url}: {text!r} not rendered"

    shot = tmp_path / "shot.png"
    proc = chromium(url, tmp_path, f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (900, 1400)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 16, "the screenshot is (nearly) blank"
    header = np.all(np.abs(pixels[:40] - HEADER_RGB) < 0.03, axis=-1)
    assert header.mean() > 0.5, "the theme's header did not render (its CSS did not load)"
    if os.environ.get("HPO_KEEP_SCREENSHOTS"):
        keep = Path(os.environ["HPO_KEEP_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / f"{page.strip('/').replace('/', '-') or 'home'}.png")
