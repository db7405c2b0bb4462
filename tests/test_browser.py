"""The lecture notebooks as a student and an instructor see them: JupyterLab and a RISE slideshow in
a real browser (Chromium driven by Playwright).

Skipped unless Chromium (``chromium`` on the PATH, or ``$FLASHCOURSE_CHROMIUM``), Playwright and
jupyterlab-rise (``pip install -e '.[lecture]' playwright``) are installed; on Debian,
``apt-get install chromium``. The server serves a copy of ``notebooks/``, so nothing here writes to
the checkout. Screenshots go to ``$FLASHCOURSE_SCREENSHOTS`` (default: the test's tmp folder), e.g.::

    FLASHCOURSE_SCREENSHOTS=/tmp/shots python -m pytest tests/test_browser.py -v

What is checked, per lecture notebook:

* **on open** (JupyterLab): the notebook is not marked modified, no LaTeX fails ("Math input
  error"), and no widget shows as its text (``VBox(children=...``): a tile stepper is a picture;
* **in the slideshow** (``/rise/NOTEBOOK``): no slide shows an nbval marker or the Colab set-up
  cell, every slide can be reached, and opening it (RISE saves the notebook first) leaves the file
  as it was; on a stepper slide, running the cell makes it a live widget;
* **run top to bottom** in JupyterLab (Run All Cells, then saved): no cell fails; then a stepper is
  moved with the keyboard and its label and frame follow;
* **on a 1280 x 720 screen** (issue 30): stepped through every slide and fragment, each slide's
  content (all its fragments shown) is at most :data:`FIT` of the screen's height, the height past
  which RISE makes a slide a scroll box, and every fragment is on the screen when it appears (RISE
  never scrolls to one). A slide too tall is saved as a screenshot, ``NOTEBOOK-tall-H-V.png``. The
  chapters not yet fitted (``tests/test_lectures.py``'s ``FITTED``) are expected to fail;
* per **exercise** notebook, shown the same way: every slide fits as a lecture's does (issue 31: the prose
  slides were 700-2100 px tall; long intros, graded code, launchers and demos are sub-slides of their own
  now), and every cell the student writes (tagged ``solution``) is at most :data:`FIT` of the screen's
  height on its own (a graded kernel with its launcher in the same cell was 727-913 px in five of the nine
  exercises; the launcher is a given cell now).

The heights of every slide of every lecture, for whoever fits one::

    python -m pytest tests/test_browser.py -k heights -s
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from flashcourse.chapters import CHAPTERS
from test_lectures import FITTED

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("FLASHCOURSE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
LECTURES = [Path(c.notebook).name for c in CHAPTERS]
EXERCISES = [Path(c.exercise).name for c in CHAPTERS if c.exercise]
STEPPERS = {name for name in LECTURES if "show_stepper(" in (ROOT / "notebooks" / name).read_text()}
#: An expression that is true when a cell's element is on the slide shown and not a hidden fragment.
ON_SLIDE = ("el => { const s = el.closest('section'); const f = el.closest('.fragment');"
            " return !!s && s.classList.contains('present') && (!f || f.classList.contains('visible')); }")


#: JupyterLab settings for the test: every cell rendered (not only those in view, JupyterLab 4's
#: default), so that the page holds the whole notebook; and no news pop-up over the screenshots.
SETTINGS = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
            "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}


def _missing() -> str | None:
    if not CHROMIUM:
        return "no Chromium (apt-get install chromium, or set FLASHCOURSE_CHROMIUM)"
    for module, why in (("playwright", "pip install playwright"), ("jupyterlab_rise", "pip install -e '.[lecture]'")):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed ({why})"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = Path(os.environ.get("FLASHCOURSE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """JupyterLab (with RISE) on a copy of notebooks/ and exercises/, no token, its own workspace folder: its URL
    and root."""
    root = tmp_path_factory.mktemp("lab")
    for folder in ("notebooks", "exercises"):
        shutil.copytree(ROOT / folder, root / folder)
    for plugin, value in SETTINGS.items():
        path = root / "settings" / f"{plugin.replace(':', '/')}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               JUPYTER_CONFIG_DIR=str(root / "config"), JUPYTER_RUNTIME_DIR=str(root / "runtime"))
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
         f"--LabApp.workspaces_dir={root / 'workspaces'}", f"--LabApp.user_settings_dir={root / 'settings'}", "--ServerApp.open_browser=False",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(120):
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"JupyterLab ended: {(root / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", root
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()


def _open(page, url: str, name: str):
    page.goto(f"{url}/lab/tree/notebooks/{name}?reset")      # ?reset: no notebook of an earlier test
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="attached")
    page.wait_for_function("() => !document.querySelector('.jp-Notebook .jp-mod-rendering')", timeout=60_000)
    time.sleep(3)                                   # MathJax typesets after the cells are attached


def _tab_dirty(page, name: str) -> bool:
    tab = page.locator(".lm-TabBar-tab", has_text=name).first
    return "jp-mod-dirty" in (tab.get_attribute("class") or "")


@pytest.mark.parametrize("name", LECTURES)
def test_notebook_opens_as_committed(server, page, shots, name):
    """Opened fresh, the notebook is unmodified, every formula typesets and a stepper is a picture."""
    url, _ = server
    _open(page, url, name)
    page.screenshot(path=str(shots / f"{Path(name).stem}-open.png"))
    assert not _tab_dirty(page, name), f"{name} shows as modified on open"
    text = page.locator(".jp-Notebook").inner_text()
    assert "Math input error" not in text
    assert page.locator(".jp-Notebook mjx-merror, .jp-Notebook .MathJax_Error").count() == 0
    assert "VBox(children" not in text, "a widget shows as its text: it needs a picture for untrusted notebooks"
    if name in STEPPERS:
        stepper = page.locator(".jp-CodeCell", has_text="show_stepper(").first
        stepper.scroll_into_view_if_needed()
        stepper.screenshot(path=str(shots / f"{Path(name).stem}-open-stepper.png"))
        assert stepper.locator(".jp-OutputArea-output img").count() >= 1


#: Where the slideshow is: the slide's address and how many fragments of it are shown.
POSITION = "() => [location.hash, document.querySelectorAll('.reveal section.present .fragment.visible').length]"


def _slide_count(page) -> int:
    return page.evaluate("() => document.querySelectorAll('.reveal .slides > section').length")


@pytest.mark.parametrize("name", LECTURES)
def test_slideshow(server, page, shots, name):
    """Every slide can be reached, none shows an nbval marker or the set-up cell, the notebook file is
    unchanged by opening it (RISE saves it first), and a stepper becomes a widget when its cell runs."""
    url, root = server
    before = (root / "notebooks" / name).read_bytes()
    page.goto(f"{url}/rise/notebooks/{name}")
    page.wait_for_selector(".reveal .slides section", state="attached")
    time.sleep(4)
    deck = page.locator(".reveal .slides").inner_text()
    for bad in ("NBVAL", "google.colab", "Generated from lectures"):
        assert bad not in deck, f"a slide of {name} shows {bad!r}"
    slides, seen, still = _slide_count(page), set(), 0
    for k in range(600):
        where = page.evaluate(POSITION)
        seen.add(where[0])
        if k < 3:
            page.screenshot(path=str(shots / f"{Path(name).stem}-slide{k}.png"))
        page.keyboard.press("Space")
        time.sleep(0.2)
        still = still + 1 if page.evaluate(POSITION) == where else 0
        if still == 3:                              # the last slide, all its fragments shown
            break
    reached = {h.split("/")[1].split("-")[1] for h in seen if h.startswith("#/slide-")}
    assert len(reached) == slides, f"reached {len(reached)} of {slides} slides of {name}"
    assert (root / "notebooks" / name).read_bytes() == before, f"opening {name} as slides changed the file"
    if name in STEPPERS:
        page.goto(f"{url}/rise/notebooks/{name}")
        page.wait_for_selector(".reveal .slides section", state="attached")
        time.sleep(4)
        cell = page.locator(".jp-CodeCell", has_text="show_stepper(").first
        for _ in range(400):
            if cell.evaluate(ON_SLIDE):
                break
            page.keyboard.press("Space")
            time.sleep(0.25)
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        cell.locator(".widget-slider, .jupyter-widget-slider").first.wait_for(timeout=120_000)
        time.sleep(2)
        page.screenshot(path=str(shots / f"{Path(name).stem}-slide-stepper.png"))


def _menu(page, menu: str, item: str):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).first.click()


@pytest.mark.parametrize("name", LECTURES)
def test_runs_top_to_bottom(server, page, shots, name):
    """Run All Cells in JupyterLab: no cell fails (read from the saved notebook); a stepper moves."""
    url, root = server
    _open(page, url, name)
    page.locator(".jp-Notebook").click(position={"x": 5, "y": 5})
    _menu(page, "Run", "Run All Cells")
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-InputPrompt').length > 0 && "
        "![...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')].some(p => p.textContent.includes('[*]') || p.textContent.includes('[ ]'))",
        timeout=900_000, polling=2000)
    page.keyboard.press("Control+s")
    page.wait_for_function(f"() => !document.querySelector('.lm-TabBar-tab.jp-mod-dirty')", timeout=60_000)
    nb = nbformat.read(root / "notebooks" / name, as_version=4)
    errors = [(c.get("id"), o.get("ename"), o.get("evalue")) for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"cells of {name} failed in JupyterLab: {errors}"
    page.screenshot(path=str(shots / f"{Path(name).stem}-run.png"), full_page=True)
    if name in STEPPERS:
        cell = page.locator(".jp-CodeCell", has_text="show_stepper(").first
        cell.scroll_into_view_if_needed()
        label = cell.locator(".widget-label, .jupyter-widget-label").filter(has_text=re.compile(r"step \d+")).first
        first_label = label.inner_text()
        image = cell.locator(".widget-image, .jupyter-widget-image").first
        first_frame = image.get_attribute("src")
        handle = cell.locator(".noUi-handle").first
        handle.click()
        handle.press("ArrowRight")
        handle.press("ArrowRight")
        page.wait_for_function("el => /step 3\\b/.test(el.textContent)", arg=label.element_handle(), timeout=60_000)
        assert image.get_attribute("src") != first_frame, "the frame did not change with the slider"
        cell.screenshot(path=str(shots / f"{Path(name).stem}-stepper-moved.png"))


# ---------------------------------------------------------------------------------------------
# Slides on a 1280 x 720 screen

#: The screen a lecture is presented on (issue 30), in CSS pixels.
SCREEN = {"width": 1280, "height": 720}
#: A slide's content fits when it is at most this share of the screen's height: RISE (``scroll``)
#: makes a taller slide a scroll box of 95% of the screen, whose hidden part the audience never sees.
FIT = 0.95
#: Slide changes without Reveal's transitions, so that what is measured is where things end up.
NO_TRANSITIONS = ".reveal .slides section, .reveal .slides section *, .reveal .fragment { transition: none !important; }"

#: The slide shown (its address without the fragment), its content's height (every cell and fragment of
#: it, shown or not: a hidden fragment keeps its room) and the screen rows of the fragments shown, the
#: bottom clipped to what a scroll box shows.
MEASURE = """() => {
  const leaf = [...document.querySelectorAll('.reveal .slides section.present')].find(s => !s.querySelector('section'));
  if (!leaf) return null;
  const parts = [...leaf.children].filter(c => getComputedStyle(c).display !== 'none' && c.offsetHeight > 0);
  const top = Math.min(...parts.map(c => c.offsetTop)), bottom = Math.max(...parts.map(c => c.offsetTop + c.offsetHeight));
  const box = leaf.getBoundingClientRect();
  const scale = box.height / (leaf.offsetHeight || 1);
  const view = leaf.scrollHeight > leaf.clientHeight + 1 ? Math.min(box.bottom, innerHeight) : innerHeight;
  const wide = [...leaf.querySelectorAll('.cm-scroller, .jp-OutputArea-output pre, .jp-OutputArea-output img')]
    .filter(e => e.tagName === 'IMG' ? e.getBoundingClientRect().right > innerWidth + 1 : e.scrollWidth > e.clientWidth + 2)
    .map(e => (e.closest('.jp-Cell') || e).getAttribute('data-windowed-list-index'));
  const cells = [...leaf.querySelectorAll('.jp-Cell')].filter(c => c.offsetHeight > 0)
    .map(c => [Number(c.getAttribute('data-windowed-list-index')), Math.round(c.offsetHeight * scale)]);
  return {slide: location.hash.split('/').slice(0, 2).join('/'), id: leaf.id, wide, cells,
          height: Math.round(parts.length ? (bottom - top) * scale : 0), scrolls: leaf.scrollHeight > leaf.clientHeight + 1,
          shown: [...leaf.querySelectorAll('.fragment.visible')].map(f => {
            const r = f.getBoundingClientRect(); return [Math.round(r.top), Math.round(r.bottom), Math.round(view)]; })};
}"""


def slide_heights(page, url: str, name: str, shots: Path | None = None, folder: str = "notebooks") -> dict:
    """Open ``folder/name`` as RISE slides on :data:`SCREEN`, step through every slide and fragment.

    Returns ``{slide address: {"height": px, "unseen": [fragments below the screen], "wide": n, "shot": path,
    "cells": {cell index: px}}}``, in the slides' order: the content's height in screen pixels with all its
    fragments, each cell's own height (its input and output), each fragment
    (numbered from 1 on its slide) that appeared outside what the screen (or the slide's scroll box)
    shows, and how many of its code cells, printed outputs and figures are wider than the slide (code
    and text that scroll sideways, a figure past the right edge). With ``shots``, a slide taller than :data:`FIT` of the screen is saved there as a
    screenshot with all its fragments shown.
    """
    limit = FIT * SCREEN["height"]
    page.goto(f"{url}/rise/{folder}/{name}")
    page.wait_for_selector(".reveal .slides section", state="attached")
    page.add_style_tag(content=NO_TRANSITIONS)
    page.wait_for_function("() => [...document.images].every(i => i.complete)")
    time.sleep(4)                                   # MathJax, and RISE's first layout
    slides, last, still = {}, None, 0
    for _ in range(1000):
        m = page.evaluate(MEASURE)
        if m is not None:
            s = slides.setdefault(m["slide"], {"height": 0, "unseen": [], "scrolls": False, "shot": None, "wide": 0,
                                               "cells": {}})
            s["height"] = max(s["height"], m["height"])
            for index, px in m["cells"]:
                s["cells"][index] = max(s["cells"].get(index, 0), px)
            s["wide"] = max(s["wide"], len(m["wide"]))
            s["scrolls"] |= m["scrolls"]
            for k, (top, bottom, view) in enumerate(m["shown"], 1):
                if (bottom > view + 1 or top < -1) and k not in s["unseen"]:
                    s["unseen"].append(k)
            if shots is not None and m["height"] > limit:  # each step again: the last one shows every fragment
                s["shot"] = shots / f"{'' if folder == 'notebooks' else folder + '-'}{Path(name).stem}-tall-{m['slide'].split('-', 1)[-1].replace('-', '.')}.png"
                page.screenshot(path=str(s["shot"]))
        where = page.evaluate(POSITION)
        page.keyboard.press("Space")
        time.sleep(0.3)
        after = page.evaluate(POSITION)
        still = still + 1 if after == where else 0
        if still == 3:                               # the last slide, all its fragments shown
            break
    return slides


#: Measured once per notebook, for the test and the report alike.
_MEASURED: dict[tuple[str, str], dict] = {}


@pytest.fixture
def screen(browser):
    context = browser.new_context(viewport=SCREEN, device_scale_factor=1)
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()


def _measured(server, screen, shots, name, folder: str = "notebooks") -> dict:
    if (folder, name) not in _MEASURED:
        _MEASURED[folder, name] = slide_heights(screen, server[0], name, shots, folder)
    return _MEASURED[folder, name]


def _too_tall(slides: dict) -> list[str]:
    limit = FIT * SCREEN["height"]
    return ([f"{k} is {s['height']} px tall" + (f" ({s['shot']})" if s["shot"] else "") for k, s in slides.items()
             if s["height"] > limit]
            + [f"{k}: fragment {f} appears off the screen" for k, s in slides.items() for f in s["unseen"]]
            + [f"{k}: {s['wide']} code, output or figure wider than the slide" for k, s in slides.items() if s["wide"]])


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if Path(n).stem in FITTED
                                                else pytest.mark.xfail(reason="not yet fitted to a slide (tests/"
                                                                       "test_lectures.py FITTED)", strict=False))
                                  for n in LECTURES])
def test_every_slide_fits_the_screen(server, screen, shots, name):
    """On a 1280 x 720 screen every slide, all its fragments shown, is at most 95% of the screen's height
    (RISE would make it a scroll box) and every fragment appears on the screen."""
    slides = _measured(server, screen, shots, name)
    assert slides, f"no slide of {name} was measured"
    bad = _too_tall(slides)
    assert not bad, f"{name} at {SCREEN['width']}x{SCREEN['height']} (limit {FIT * SCREEN['height']:.0f} px): " + "; ".join(bad)


def graded_cells(name: str) -> dict[int, str]:
    """The cells of ``exercises/name`` that the student writes (tagged ``solution``): ``{cell index: cell name}``."""
    nb = json.loads((ROOT / "exercises" / name).read_text(encoding="utf-8"))
    return {k: c["metadata"].get("name", str(k)) for k, c in enumerate(nb["cells"])
            if "solution" in c["metadata"].get("tags", [])}


def cell_heights(slides: dict) -> dict[int, int]:
    """Each measured cell's height in screen pixels, its largest over the slides it was on."""
    heights: dict[int, int] = {}
    for s in slides.values():
        for index, px in s["cells"].items():
            heights[index] = max(heights.get(index, 0), px)
    return heights


@pytest.mark.parametrize("name", EXERCISES)
def test_every_graded_cell_fits_the_screen(server, screen, shots, name):
    """The cells a student writes, presented as slides in class, fit the screen on their own (issue 31): a
    graded kernel holds what the student writes and what it needs in view, its launcher is a given cell of
    its own."""
    heights = cell_heights(_measured(server, screen, shots, name, "exercises"))
    graded = graded_cells(name)
    assert graded, f"exercises/{name} has no cell tagged solution"
    missing = [graded[k] for k in graded if k not in heights]
    assert not missing, f"exercises/{name}: cells never shown on a slide: {missing}"
    limit = FIT * SCREEN["height"]
    tall = [f"{graded[k]} is {heights[k]} px tall" for k in graded if heights[k] > limit]
    assert not tall, f"exercises/{name} at {SCREEN['width']}x{SCREEN['height']} (limit {limit:.0f} px): " + "; ".join(tall)


@pytest.mark.parametrize("name", EXERCISES)
def test_every_exercise_slide_fits_the_screen(server, screen, shots, name):
    """An exercise presented as slides in class: every slide, all its fragments shown, fits the screen as a
    lecture's must (issue 31: the exercises' prose slides were 700-2000 px tall)."""
    slides = _measured(server, screen, shots, name, "exercises")
    assert slides, f"no slide of exercises/{name} was measured"
    bad = _too_tall(slides)
    assert not bad, f"exercises/{name} at {SCREEN['width']}x{SCREEN['height']} (limit {FIT * SCREEN['height']:.0f} px): " + "; ".join(bad)


def test_report_slide_heights(server, screen, shots, capsys):
    """Print every lecture's slide heights and every exercise's graded cells' heights on a 1280 x 720 screen
    (``-k heights -s``); asserts nothing."""
    limit = FIT * SCREEN["height"]
    for name in EXERCISES:
        heights = cell_heights(_measured(server, screen, shots, name, "exercises"))
        with capsys.disabled():
            print(f"\nexercises/{name}, the graded cells: " + ", ".join(
                f"{cell} {heights.get(k, 0)} px{' TOO TALL' if heights.get(k, 0) > limit else ''}"
                for k, cell in graded_cells(name).items()))
    for folder, name in [("notebooks", n) for n in LECTURES]:
        slides = _measured(server, screen, shots, name, folder)
        tall = [s for s in slides.values() if s["height"] > limit]
        with capsys.disabled():
            print(f"\n{folder}/{name}: {len(slides)} slides, {len(tall)} taller than {limit:.0f} px, tallest "
                  f"{max((s['height'] for s in slides.values()), default=0)} px")
            for k, s in slides.items():
                flag = " TOO TALL" if s["height"] > limit else ""
                unseen = f" fragments off the screen: {s['unseen']}" if s["unseen"] else ""
                unseen += f" {s['wide']} too wide" if s["wide"] else ""
                print(f"  {k:16} {s['height']:5} px{flag}{unseen}{'  ' + str(s['shot']) if s['shot'] else ''}")



def test_the_height_check_sees_a_tall_slide_and_a_fragment_below_the_screen(server, screen, shots):
    """A notebook written as nbtools writes them (its RISE settings): a slide of 40 lines of prose with a
    fragment under them is too tall, and the fragment appears off the screen; a short slide fits."""
    import nbformat
    import nbtools
    url, root = server
    nb = nbformat.v4.new_notebook()
    nb.metadata["rise"] = dict(nbtools.RISE)
    nb.cells = [nbtools.md("# Short\n\nOne line.", "slide"),
                nbtools.md("## Tall\n\n" + "\n\n".join(f"Line {k} of a slide that is far too long." for k in range(40)),
                           "slide"),
                nbtools.md("**The fragment under them.**", "fragment")]
    nbformat.write(nb, root / "notebooks" / "zz_tall.ipynb")
    slides = slide_heights(screen, url, "zz_tall.ipynb", shots)
    short, tall = slides["#/slide-0-0"], slides["#/slide-1-0"]
    assert short["height"] <= FIT * SCREEN["height"] and not short["unseen"] and short["shot"] is None
    assert tall["height"] > 2 * SCREEN["height"] and tall["unseen"] == [1]
    assert tall["shot"].is_file()
    assert _too_tall(slides) == [f"#/slide-1-0 is {tall['height']} px tall ({tall['shot']})",
                                 "#/slide-1-0: fragment 1 appears off the screen"]
