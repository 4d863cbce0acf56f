"""The documentation site builds without warnings (mkdocs --strict, mkdocs.yml) and the
generated reference pages match the code they are generated from."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference",
                                                  REPO / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mkdocs_build(root, site_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(root / "mkdocs.yml"), "-d", str(site_dir)],
                          cwd=root, capture_output=True, text=True, timeout=300)


def test_reference_pages_are_current():
    stale = _generator().stale_pages()
    assert not stale, f"{[str(p) for p in stale]} stale: run scripts/gen_reference.py"


def test_a_new_flag_or_profile_key_makes_them_stale(monkeypatch):
    import ddl.commands.parser
    import ddl.settings.sites

    gen = _generator()
    make_parser = ddl.commands.parser.make_parser

    def with_extra_flag():
        parser = make_parser()
        parser.add_argument("--brand-new-flag", help="not in the committed page")
        return parser

    monkeypatch.setattr(ddl.commands.parser, "make_parser", with_extra_flag)
    assert "--brand-new-flag" in gen.cli_page()
    assert gen.CLI_PAGE in gen.stale_pages()

    class Extended(ddl.settings.sites.SiteProfile):
        brand_new_key: int = 0

    monkeypatch.setattr(ddl.settings.sites, "SiteProfile", Extended)
    assert "`brand_new_key`" in gen.schema_page()
    assert gen.SCHEMA_PAGE in gen.stale_pages()


def test_site_builds_without_warnings(tmp_path):
    proc = _mkdocs_build(REPO, tmp_path / "site")
    hint = "\n(a new page under docs/ needs an entry in mkdocs.yml's nav)"
    assert proc.returncode == 0, proc.stderr + hint
    assert "WARNING" not in proc.stderr, proc.stderr + hint
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
    # the site's root is the front page (docs/index.md), not a 404
    root = (tmp_path / "site" / "index.html").read_text()
    assert "Where to read, by what you came for" in root
    assert (tmp_path / "site" / "plugin-authors" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs",
                    ignore=shutil.ignore_patterns("examples"))
    page = tmp_path / "docs" / "plugins.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    proc = _mkdocs_build(tmp_path, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr
