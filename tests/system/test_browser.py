"""Pages opened in a real headless Chromium (tests/system/webdriver.py; installed by the
`chromium` fixture when missing):

- report.html of `ddl report`, for one run (4 pipeline ranks, a command line with a
  <script> in it) and for a study: the page loads without a SEVERE console entry, runs no
  script, and every image decodes (complete, natural width > 0);
- the documentation site (`mkdocs build --strict`): on the home page and the tutorial no
  command is clipped (issue 24, acceptance 5): every <pre> of the content column shows its
  whole width, every inline <code> ends inside the box that clips it, the column does not
  scroll sideways. tests/unit/test_docs_pages.py checks the CSS rules; this checks what a
  browser makes of them.
"""

from __future__ import annotations

import sys

import pytest
from conftest import REPO, run_bounded, run_ddl
from report_runs import HOSTILE, write_run

from .webdriver import Browser

pytestmark = pytest.mark.system

IMAGES = """return [...document.images].map(i => ({alt: i.alt, complete: i.complete,
    width: i.naturalWidth}))"""

CLIPPED = """
const main = document.querySelector('[role="main"]') || document.querySelector('.rst-content');
const column = document.querySelector('.wy-nav-content') || main;
const what = el => el.tagName.toLowerCase() + ': ' + el.textContent.trim().slice(0, 100);
const bad = [];
const pres = [...main.querySelectorAll('pre')];
for (const pre of pres) {
  if (pre.scrollWidth > pre.clientWidth + 1)
    bad.push(`${what(pre)} (scrollWidth ${pre.scrollWidth} > clientWidth ${pre.clientWidth})`);
}
const codes = [...main.querySelectorAll('code')].filter(c => !c.closest('pre'));
for (const code of codes) {  // inline: must end inside the nearest box that clips or scrolls
  let box = code.parentElement;
  while (box !== main && getComputedStyle(box).overflowX === 'visible') box = box.parentElement;
  const right = code.getBoundingClientRect().right;
  const limit = box.getBoundingClientRect().left + box.clientLeft + box.clientWidth;
  if (right > limit + 1) bad.push(`${what(code)} (ends at ${right}, its box at ${limit})`);
}
if (column.scrollWidth > column.clientWidth + 1)
  bad.push(`content column (scrollWidth ${column.scrollWidth} > ${column.clientWidth})`);
return {bad: bad, pres: pres.length, codes: codes.length};
"""


PLANT = """
const pre = document.createElement('pre');
pre.style.whiteSpace = 'pre';
pre.textContent = 'ddl-planted ' + '--a-long-flag=value '.repeat(40);
(document.querySelector('[role="main"]') || document.querySelector('.rst-content')).append(pre);
"""


@pytest.fixture(scope="module")
def browser(chromium):
    with Browser(chromium["chromedriver"], chromium["chromium"]) as b:
        yield b


def test_report_pages_load_without_errors_and_their_images_decode(browser, tmp_path):
    run = write_run(tmp_path / "pp", ranks=4, pipeline=True,
                    command=["ddl", "train", "--run-dir", HOSTILE])
    study = [write_run(tmp_path / "study" / f"n{n}", ranks=n) for n in (1, 2)]
    assert study
    for args in ([str(run), "--output", str(tmp_path / "run-report")],
                 [str(tmp_path / "study")]):
        proc = run_ddl("report", *args)
        assert proc.returncode == 0, proc.stderr
    for page, least in ((tmp_path / "run-report" / "report.html", 7),
                        (tmp_path / "study" / "report.html", 4)):
        browser.open(page.as_uri())
        assert browser.run("return document.readyState") == "complete"
        images = browser.run(IMAGES)
        broken = [i for i in images if not (i["complete"] and i["width"] > 0)]
        assert len(images) >= least and not broken, (page, broken)
        assert browser.run("return document.scripts.length") == 0, page
        severe = [e for e in browser.console() if e.get("level") == "SEVERE"]
        assert not severe, (page, severe)


def test_docs_pages_clip_no_command(browser, tmp_path):
    site = tmp_path / "site"
    build = run_bounded([sys.executable, "-m", "mkdocs", "build", "--strict",
                         "-f", str(REPO / "mkdocs.yml"), "-d", str(site)], cwd=REPO, timeout=300)
    assert build.returncode == 0, build.stderr
    clipped = {}
    for page in ("index.html", "tutorial/index.html"):
        browser.open((site / page).as_uri())
        found = browser.run(CLIPPED)
        assert found["pres"] + found["codes"] > 0, page  # the script found the column
        shot = browser.screenshot()  # kept beside the test's files, for a person to look at
        (tmp_path / (page.replace("/", "-") + ".png")).write_bytes(shot)
        assert shot.startswith(b"\x89PNG\r\n\x1a\n") and len(shot) > 10_000, page
        if found["bad"]:
            clipped[page] = found["bad"]
    # the check can fail: a planted command that neither wraps nor fits
    browser.run(PLANT)
    assert any("ddl-planted" in b for b in browser.run(CLIPPED)["bad"])
    assert not clipped, "clipped in the content column:\n" + "\n".join(
        f"{page}: {b}" for page, bad in clipped.items() for b in bad)
