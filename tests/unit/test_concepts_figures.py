"""The figures of docs/concepts.md (docs/img/concepts/*.svg) are what
scripts/draw_concepts.py draws now, there is one per collective and one per strategy (and a
ring all-reduce against a parameter server), and the page shows each of them; the figures
of other pages (the 3-D mesh of layout.md, the LUMI-G node map) are shown on theirs, and
the node map says what sites/lumi-g.toml binds. Pure Python, no torch: well under a
second."""

from __future__ import annotations

import importlib.util
import re
import tomllib
import xml.etree.ElementTree as ET

import pytest
from conftest import REPO

pytestmark = pytest.mark.unit

COLLECTIVES = ["broadcast", "all-reduce", "reduce-scatter", "all-gather", "send-recv",
               "ring-allreduce"]
STRATEGIES = ["ddp", "fsdp", "hsdp", "tp", "pp", "3d"]
REGENERATE = "python scripts/draw_concepts.py"


def _script():
    spec = importlib.util.spec_from_file_location("draw_concepts",
                                                  REPO / "scripts" / "draw_concepts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_figures_are_current():
    stale = _script().stale(REPO / "docs" / "img" / "concepts")
    assert not stale, f"stale or missing figures {stale} in docs/img/concepts: run {REGENERATE}"


def test_one_figure_per_collective_and_strategy_each_shown_on_the_page():
    drawn = _script().figures()
    wanted = {f"{name}.svg" for name in COLLECTIVES + STRATEGIES}
    assert wanted <= set(drawn), f"not drawn: {sorted(wanted - set(drawn))}"
    others = _script().OTHER_PAGES
    page = (REPO / "docs" / "concepts.md").read_text()
    shown = set(re.findall(r"\]\(img/concepts/([\w.-]+\.svg)\)", page))
    here = set(drawn) - set(others)
    assert shown == here, f"drawn but not on the page: {sorted(here - shown)}; " \
                          f"on the page but not drawn: {sorted(shown - here)}"
    for name, other in others.items():
        assert name in drawn, name
        assert f"](img/concepts/{name})" in (REPO / "docs" / other).read_text(), \
            f"docs/{other} does not show {name}"


def test_lumi_node_map_is_the_binding_ddl_applies(tmp_path):
    """Each GCD's cores and srun mask on the figure are sites/lumi-g.toml's; a changed
    profile changes the figure (it is drawn from the profile, not typed in)."""
    script = _script()
    profile = REPO / "sites" / "lumi-g.toml"
    binding = tomllib.loads(profile.read_text())["cpu_binding"]
    masks = binding["srun"].split(":", 1)[1].split(",")
    text = script.figures()["lumi-g-node.svg"]
    assert len(binding["worker_cores"]) == len(masks) == 8
    for gcd, (cores, mask) in enumerate(zip(binding["worker_cores"], masks)):
        assert f"rank {gcd}: GCD {gcd}, cores {min(cores)}-{max(cores)}, {mask}" in text, gcd
    moved = profile.read_text().replace("[49, 50, 51, 52, 53, 54, 55]",
                                        "[48, 50, 51, 52, 53, 54, 55]")
    assert moved != profile.read_text()
    (tmp_path / "lumi-g.toml").write_text(moved)
    assert "cores 48-55" in script.lumi_node_figure(tmp_path / "lumi-g.toml")


def test_figures_are_self_contained_svg_for_the_column():
    for name, text in _script().figures().items():
        root = ET.fromstring(text)  # well-formed XML
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
        assert int(root.get("width")) <= 700, name  # the docs' content column
        # nothing fetched from elsewhere: no scripts, images, links or web fonts
        assert not re.search(r"<script|<image|href=|@import|url\(", text), name


def test_the_check_fails_on_a_changed_or_missing_figure(tmp_path, capsys):
    script = _script()
    assert script.main(["--out", str(tmp_path)]) == 0
    assert script.main(["--check", "--out", str(tmp_path)]) == 0
    changed = tmp_path / "all-reduce.svg"
    data = bytearray(changed.read_bytes())
    data[-10] ^= 1  # one byte
    changed.write_bytes(bytes(data))
    (tmp_path / "ddp.svg").unlink()
    capsys.readouterr()
    assert script.main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert str(changed) in out and str(tmp_path / "ddp.svg") in out and REGENERATE in out
    assert "fsdp.svg" not in out  # only the damaged ones are named
    assert script.stale(tmp_path) == ["all-reduce.svg", "ddp.svg"]
