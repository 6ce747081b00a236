"""``pipeplan report PLAN --compare PLAN --html FILE``: one self-contained page (no script, no
fetched file) with the plan's summary, its timeline, memory per GPU against the limit, where
the iteration goes and the comparison; opened in a real headless browser, whose screenshot
shows the timeline, the tables and the bars in the page's order."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from pipeplan.cli import main
from pipeplan.sim.explain import TERMS

MODEL = "zoo:llama3-8b?seq=512"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each element by id."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.rows: dict[str, int] = {}
        self._table: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table = a.get("id")
        if tag == "tr" and self._table:
            self.rows[self._table] = self.rows.get(self._table, 0) + 1


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Two plan files of Llama 3 8B on 16 H100s (TP 8 x DP 2, and TP 2 x PP 2 x DP 4)."""
    folder = tmp_path_factory.mktemp("report")
    names = []
    for tag, opts in (("a", ["-O", "tp=8", "-O", "pp=1"]), ("b", ["-O", "tp=2", "-O", "pp=2"])):
        path = folder / f"{tag}.json"
        assert main(["plan", "--model", MODEL, "--cluster", "dgx-h100x2", "--global-batch", "64", "--planner",
                     "megatron", *opts, "--out", str(path)]) == 0
        names.append(str(path))
    return folder, names


def _prediction(path: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["simulate", path, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_page_holds_every_section_and_fetches_nothing(pages, capsys):
    folder, (a, b) = pages
    html = folder / "r.html"
    assert main(["report", a, "--compare", b, "--html", str(html)]) == 0
    text = html.read_text()
    tags = _Tags()
    tags.feed(text)
    assert not [t for t, _ in tags.tags if t in ("script", "link", "iframe", "object", "embed")]
    for tag, attrs in tags.tags:
        for key in ("src", "href"):
            assert key not in attrs or attrs[key].startswith("data:"), (tag, attrs)
    ids = {attrs.get("id") for _, attrs in tags.tags}
    assert {"summary", "timeline", "gantt", "memory", "memory-table", "breakdown", "breakdown-table",
            "comparison", "comparison-table"} <= ids
    img = next(attrs for tag, attrs in tags.tags if attrs.get("id") == "gantt")
    png = base64.b64decode(img["src"].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pa, pb = _prediction(a, capsys), _prediction(b, capsys)
    assert tags.rows["memory-table"] == 1 + len(pa["devices"])  # a header, a row a device (TP group)
    assert tags.rows["comparison-table"] == 3 and tags.rows["breakdown-table"] == 1 + len(TERMS) + 1
    speed = pa["iteration_s"] / pb["iteration_s"]
    assert f"<td>{speed:.3g}x</td>" in text and "<td>1x</td>" in text
    assert f"{pa['mfu']:.1%}" in text and f"{pb['mfu']:.1%}" in text


def test_a_bad_target_writes_nothing(pages, capsys, tmp_path):
    folder, (a, _) = pages
    assert main(["report", a, "--html", str(tmp_path / "r.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".html" in err and not any(tmp_path.iterdir())
    assert main(["report", a, "--compare", str(tmp_path / "none.json"), "--html", str(tmp_path / "r.html")]) == 2
    assert not any(tmp_path.iterdir())


def _browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _first_row(img: np.ndarray, colour: str) -> tuple[int, int]:
    """(pixels of exactly ``colour``, the first row holding one; -1 if none)."""
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)
    hit = np.all(img[:, :, :3] == rgb, axis=2)
    rows = np.flatnonzero(hit.any(axis=1))
    return int(hit.sum()), int(rows[0]) if rows.size else -1


@pytest.mark.slow
def test_the_page_renders_in_a_headless_browser(pages, tmp_path):
    """Chromium (headless, offline, a fresh profile) screenshots the page: the Gantt chart's
    backward bars, the tables' header shading, the memory bars and the breakdown's bar are on
    screen, in the page's order (timeline above memory above the breakdown)."""
    from pipeplan.cli.html_report import HEADER_COLOUR, MEMORY_COLOUR, TERM_COLOUR

    browser = _browser()
    if browser is None:
        pytest.skip("no headless Chromium or Chrome here (make test installs Debian's chromium where apt-get can)")
    folder, (a, b) = pages
    html = tmp_path / "r.html"
    assert main(["report", a, "--compare", b, "--html", str(html)]) == 0
    shot = tmp_path / "shot.png"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1280,2600",
                           f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[1] == 1280
    seen = {what: _first_row(img, colour) for what, colour in (
        ("gantt backward", "#1f78b4"), ("table header", HEADER_COLOUR), ("memory bar", MEMORY_COLOUR),
        ("breakdown tp", TERM_COLOUR["tp_comm"]))}
    for what, (pixels, row) in seen.items():
        assert pixels > 200, (what, seen)
    assert seen["gantt backward"][1] < seen["memory bar"][1] < seen["breakdown tp"][1], seen
