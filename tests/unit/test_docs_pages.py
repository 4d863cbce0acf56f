"""The built site loads nothing from the network and keeps commands and wide tables inside
the content column (issue 24, item 6); workload pages are short user pages whose maintainer
material lives on a linked design-notes page; the course-parity page covers four courses.

What the CSS does in a browser is not checked here (no browser on this machine): the test
checks that every built page links stylesheets whose cascade ends in the rules that keep
code and tables within the column."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

WORKLOADS = REPO / "docs" / "workloads"
USER_PAGE_MAX_LINES = 120
REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)

# selector -> property -> allowed final values, after the whole cascade of a page's sheets
COLUMN_RULES = {
    ".wy-nav-content": {"max-width": {"none"}},
    ".rst-content pre": {"white-space": {"pre-wrap"}, "max-width": {"100%"}},
    ".rst-content pre code": {"white-space": {"pre-wrap"}},
    ".rst-content table": {"display": {"block"}, "max-width": {"100%"},
                           "overflow-x": {"auto", "scroll"}},
    ".rst-content table td": {"white-space": {"normal"}},
}


class _Resources(HTMLParser):
    """Collects what a page makes the browser fetch: scripts, stylesheets, fonts, icons,
    images, frames, and url()/@import inside inline CSS. Plain links (<a href>) are prose."""

    def __init__(self):
        super().__init__()
        self.loads: list[str] = []
        self.stylesheets: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "embed") and attrs.get("src"):
            self.loads.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            rel = (attrs.get("rel") or "").lower()
            if rel not in ("canonical", "alternate", "next", "prev"):
                self.loads.append(attrs["href"])
            if "stylesheet" in rel:
                self.stylesheets.append(attrs["href"])
        self.loads.extend(_css_urls(attrs.get("style") or ""))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.loads.extend(_css_urls(data))


def _css_urls(css: str) -> list[str]:
    return [a or b for a, b in CSS_URL.findall(css)]


def remote_loads(html: str) -> list[str]:
    parser = _Resources()
    parser.feed(html)
    return [url for url in parser.loads if REMOTE.match(url)]


def cascade(css_texts: list[str], selector: str) -> dict[str, str]:
    """The declarations that end up applying to exactly `selector`, later sheets and rules
    winning (top-level rules only; @media blocks are skipped, as they apply to some widths)."""
    result: dict[str, str] = {}
    for css in css_texts:
        css = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
        css = re.sub(r"@media[^{]*\{(?:[^{}]*\{[^{}]*\})*[^{}]*\}", "", css)
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
            if selector not in (s.strip() for s in selectors.split(",")):
                continue
            for decl in body.split(";"):
                if ":" in decl:
                    name, value = decl.split(":", 1)
                    result[name.strip().lower()] = value.replace("!important", "").strip()
    return result


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, "the site was not built"
    return pages


def test_no_page_loads_anything_from_the_network(site):
    offenders = {str(p.relative_to(site)): remote_loads(p.read_text()) for p in _pages(site)}
    offenders = {page: urls for page, urls in offenders.items() if urls}
    assert not offenders, f"pages load remote scripts/styles/fonts: {offenders}"
    sheets = {str(p.relative_to(site)): [u for u in _css_urls(p.read_text()) if REMOTE.match(u)]
              for p in site.rglob("*.css")}
    assert not {k: v for k, v in sheets.items() if v}, sheets


def test_the_check_finds_a_cdn_highlighter_but_not_a_prose_link():
    # what the readthedocs theme writes with highlightjs on
    page = ('<link rel="stylesheet" href="https://cdnjs.cloudflare.com/ajax/libs/highlight.js/'
            '11.8.0/styles/github.min.css" /><script src="//cdn.example/x.js"></script>'
            '<style>@font-face{src:url("https://fonts.example/f.woff2")}</style>'
            '<a href="https://docs.lumi-supercomputer.eu/">LUMI</a><script src="js/theme.js">')
    assert len(remote_loads(page)) == 3


@functools.lru_cache(maxsize=None)
def _applied(sheets: tuple[Path, ...], selector: str) -> dict[str, str]:
    return cascade([sheet.read_text() for sheet in sheets], selector)


def test_every_page_keeps_code_and_tables_in_the_column(site):
    for page in _pages(site):
        parser = _Resources()
        parser.feed(page.read_text())
        # 404.html links from the site root ("/css/..."), the others relative to the page
        sheets = tuple((site / href[1:] if href.startswith("/") else page.parent / href).resolve()
                       for href in parser.stylesheets if not REMOTE.match(href))
        for selector, wanted in COLUMN_RULES.items():
            applied = _applied(sheets, selector)
            for prop, allowed in wanted.items():
                assert applied.get(prop) in allowed, (
                    f"{page.relative_to(site)}: {selector} {{{prop}: {applied.get(prop)}}} "
                    f"after its stylesheets {parser.stylesheets}; wanted one of {allowed}")


def test_the_cascade_sees_the_theme_win_when_it_comes_last():
    ours = ".rst-content pre, .rst-content pre code { white-space: pre-wrap; }"
    theme = ".rst-content pre code{white-space:pre;display:block}"
    assert cascade([theme, ours], ".rst-content pre code")["white-space"] == "pre-wrap"
    assert cascade([ours, theme], ".rst-content pre code")["white-space"] == "pre"


def test_code_is_highlighted_at_build_time(site):
    html = (site / "tutorial" / "index.html").read_text()
    assert 'class="codehilite"' in html
    assert re.search(r'<span class="(k|nb|nv|s[12]?|o|m|c1?)">', html), "no pygments tokens"
    assert "hljs" not in html
    assert ".codehilite .k " in (site / "css" / "highlight.css").read_text()


@pytest.mark.parametrize("name", ["cifar", "imagewoof", "xsum"])
def test_workload_user_page_is_short_and_links_its_design_notes(name):
    user = (WORKLOADS / f"{name}.md").read_text()
    design = WORKLOADS / f"{name}-design.md"
    assert len(user.splitlines()) <= USER_PAGE_MAX_LINES, f"{name}.md: keep the user page short"
    assert f"]({name}-design.md)" in user
    assert design.is_file() and f"]({name}.md)" in design.read_text()
    for section in ("## Run it", "## Presets", "## Data", "## What numbers to expect"):
        assert section in user, f"{name}.md lacks {section!r}"


@pytest.mark.parametrize("name,material", [("cifar", "The md5 question"),
                                           ("imagewoof", "FF D9 end marker"),
                                           ("xsum", "relative-position table")])
def test_maintainer_material_is_on_the_design_page(name, material):
    assert material not in (WORKLOADS / f"{name}.md").read_text()
    assert material in (WORKLOADS / f"{name}-design.md").read_text()


def test_course_parity_has_a_step_table_per_course():
    text = (REPO / "docs" / "course-parity.md").read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    titles = [s.splitlines()[0] for s in sections]
    for course in ("fastai", "JSC course", "BSC", "Horovod"):
        assert any(course in t for t in titles), f"no section for {course}: {titles}"
    for section in sections:
        rows = [line for line in section.splitlines() if line.startswith("| ")]
        assert rows[0] == "| step in the course | ddl page | still missing |"
        gaps = [r for r in rows[2:] if not r.rstrip().endswith("| — |")]
        assert len(rows) >= 7 and gaps, f"{section.splitlines()[0]}: steps and honest gaps"


# --- what running the docs leaves behind is ignored by git (issue 43) -------------------------
RUNNABLE = re.compile(r"<!-- runnable-on-cpu -->\n```(?:sh|bash|console)\n(.*?)\n```", re.S)
WRITES = re.compile(r">\s*([\w./-]+)|--(?:run-dir|data-dir|output|output-dir)[ =]([\w./-]+)")


def written_paths(block: str) -> list[str]:
    """Paths a shell block writes: files it redirects into, and the directories of ddl's
    output flags (with a trailing slash: git matches `/data/` only to a directory)."""
    return [file or f"{folder.rstrip('/')}/" for file, folder in WRITES.findall(block)
            if not (file or folder).startswith("/dev/")]


def unignored(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to the repository root) that git would show as new."""
    if not paths:
        return []
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO,
                          capture_output=True, text=True)
    ignored = set(proc.stdout.split())
    return [p for p in paths if p not in ignored]


def test_running_the_docs_blocks_and_building_the_site_leaves_git_status_clean():
    """The tutorial's and getting-started's marked blocks are run from the repository root;
    every file they write (and mkdocs' site_dir) is under an ignored path, so `git status`
    stays clean after them."""
    paths = []
    for page in ("tutorial.md", "getting-started.md"):
        for block in RUNNABLE.findall((REPO / "docs" / page).read_text()):
            paths += written_paths(block)
    assert "runs/job.sh" in paths and "runs/one/" in paths  # the pattern finds them
    site_dir = re.search(r"^site_dir:\s*(\S+)", (REPO / "mkdocs.yml").read_text(), re.M)
    paths.append(f"{site_dir.group(1) if site_dir else 'site'}/")
    assert not unignored(paths), unignored(paths)


def test_the_clean_status_check_names_an_unignored_path():
    block = "./ddl submit --dry-run > job.sh\n./ddl train --run-dir runs/x"
    assert written_paths(block) == ["job.sh", "runs/x/"]
    assert unignored(written_paths(block)) == ["job.sh"]
