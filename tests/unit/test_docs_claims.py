"""Claims of the docs that issue 52 found wrong, each checked against its source: the JSC
course's own numbering (the XSum T5 exercise's TODO 1-15), the repository's files, ddl's
own output. Every check fails on the text before the fix. Reading files only (and one
`ddl layout` rendered in-process): well under a second."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

DOCS = REPO / "docs"


def _read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _section(text: str, title_start: str) -> str:
    """The markdown section whose ``## `` title starts with ``title_start``."""
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    return next(p for p in parts[1:] if p.startswith(title_start))


def _todo_rows(text: str) -> dict[str, str]:
    """Table rows whose first cell starts with TODO: {"4": row, "5-8": row, ...}."""
    return {m.group(1): line for line in text.splitlines()
            if (m := re.match(r"\|\s*TODO (\d+(?:-\d+)?):", line))}


def _numbers(label: str) -> list[int]:
    first, _, last = label.partition("-")
    return list(range(int(first), int(last or first) + 1))


# --- item 14: the XSum T5 slides' numbering, train.py TODO 1-15 ----------------------------
# The course's train.py (TODO 1-12) and run_train.sbatch (13-15), as its slides walk through
# them (javak87/2025-06-course-..., commit c6b5424): what each TODO does.
COURSE_TODOS = {1: "distributed_utils", 4: "DistributedDataParallel", 5: "DistributedSampler",
                9: "set_epoch", 10: "all_reduce", 11: "print0", 12: "save0",
                13: "--gres=gpu:4", 14: "MASTER_ADDR", 15: "torchrun_jsc"}


@pytest.mark.parametrize("page", ["course-parity.md", "code-behind-ddl.md"])
def test_pages_number_the_jsc_exercise_as_its_xsum_slides_do(page):
    text = _read(page)
    if page == "course-parity.md":
        text = _section(text, "JSC course")
        assert "code/parallelize/train.py" in text and "run_train.sbatch" in text
    rows = _todo_rows(text)
    covered = sorted(n for label in rows for n in _numbers(label))
    assert covered == list(range(1, 16)), f"{page}: TODOs {covered}, the slides have 1-15"
    for number, what in COURSE_TODOS.items():
        row = next(r for label, r in rows.items() if number in _numbers(label))
        assert what in row, f"{page}: TODO {number} is about {what!r}: {row[:100]}"


def test_the_pages_links_name_todos_the_mapping_page_has():
    parity = _section(_read("course-parity.md"), "JSC course")
    mapping = set(_todo_rows(_read("code-behind-ddl.md")))
    cited = re.findall(r"\(code-behind-ddl\.md\), TODO (\d+(?:-\d+)?)", parity)
    assert cited and set(cited) <= mapping, (sorted(set(cited) - mapping), sorted(mapping))
    # the third numbering ("steps 1, 2 and 4", "step 8") is gone from both pages
    for page in ("course-parity.md", "code-behind-ddl.md"):
        assert not re.search(r"code-behind-ddl\.md\), steps? \d|\(step \d+\)", _read(page))


def test_other_pages_and_the_example_use_the_same_numbers():
    assert "TODO 4 the `DistributedDataParallel` wrap" in _read("gpus-per-process.md")
    example = (DOCS / "examples" / "hand_written_ddp.py").read_text()
    assert "# TODO 4: wrap" in example and "# TODO 9:" in example
    assert not re.search(r"# \d+\. ", example)  # the old "# 5. Wrap" numbering


def test_the_bsc_hands_on_claims_no_multi_node_horovod():
    """The BSC hands-on (MirroredStrategy on one node) has no multi-node Horovod step; the
    -ib0 suffix comes from another lab's scripts in the same repository."""
    bsc = _section(_read("course-parity.md"), "BSC")
    rows = [line for line in bsc.splitlines() if line.startswith("| ")]
    assert not any("Horovod" in row for row in rows), rows
    assert "job_hvd_multi_node_8gpus.sh" in bsc  # where -ib0 does come from


def test_async_and_decentralised_sgd_are_on_the_page():
    parity = _read("course-parity.md")
    assert "asynchronous SGD" in parity and "decentralised asynchronous SGD" in parity
    assert "concepts.md#synchronous-data-parallel-only" in parity
    concepts = _section(_read("concepts.md"), "Synchronous data parallel only")
    assert "asynchronous SGD" in concepts and "decentralised" in concepts


# --- item 15 --------------------------------------------------------------------------------
def test_measuring_says_the_nvml_reader_ran_and_names_a_file_that_shows_it():
    text = _read("measuring.md")
    assert "follow the libraries' documented calls but have not run here" not in text
    utilisation = _section(text, "Utilisation")
    cited = re.search(r"`(benchmarks/results/gpu_check-[\w.-]+\.json)`", utilisation)
    assert cited, "the NVML claim names no results file"
    results = (REPO / cited.group(1)).read_text()
    assert '"device_util_source": "nvml"' in results


def test_tutorial_summary_has_no_unsourced_throughput():
    summary = _section(_read("tutorial.md"), "Summary of the measurements")
    head = next(line for line in summary.splitlines() if line.startswith("| step"))
    assert "samples/s" not in head
    # every model-state value in the table is one a step's "Measured here" states
    measured = " ".join(re.findall(r"Measured here[^\n]*(?:\n(?!\n)[^\n]*)*",
                                   _read("tutorial.md")))
    for value in re.findall(r"\| ([\d.]+ (?:kB|MB))", summary):
        assert value in measured, value


def test_tutorial_step_7_claims_no_torch_warning():
    assert "sequential all-gathers" not in _section(_read("tutorial.md"), "7. 2-D")


def test_tutorial_step_3_grep_shows_the_torchrun_jsc_line_it_discusses():
    step = _section(_read("tutorial.md"), "3. Several nodes")
    pattern = re.search(r'grep -E "([^"]+)" runs/job\.sh', step).group(1)
    assert "torchrun_jsc" in step.split("```", 2)[2]  # the text discusses it
    script = (REPO / "tests" / "unit" / "golden" / "jureca-dc-2n.sbatch").read_text()
    shown = [line for line in script.splitlines() if re.search(pattern, line)]
    assert any("--launcher=torchrun_jsc" in line for line in shown), shown


def test_concepts_first_figure_says_ddl_layout_flags_its_layout():
    from ddl.commands.layout import _place, render

    text = _read("concepts.md")
    after = text.split("(img/concepts/ranks.svg)", 1)[1].split("## ", 1)[0]
    note = re.search(r'says so in a note \("([^"]+)"\)', after.replace("\n", " "))
    assert note, "the figure's layout is not said to be flagged"
    flagged = " ".join(render(*_place({"tp": 2, "dp_shard": 4}, None, 2)).split())
    assert " ".join(note.group(1).split()) in flagged
    suggested = render(*_place({"dp_replicate": 2, "dp_shard": 2, "tp": 2}, None, 2))
    assert "--mesh dp_replicate=2,dp_shard=2,tp=2" in after and "note:" not in suggested


def test_layout_md_t5_large_count_is_the_benchmarks():
    bench = json.loads((REPO / "benchmarks" / "results" / "meta_build.json").read_text())
    counts = [run["parameters"] for run in _runs(bench) if run.get("parameters")]
    t5 = next(c for c in counts if 700e6 < c < 750e6)
    assert f"t5-large ({t5 / 1e6:.1f}M parameters)" in _read("layout.md")


def _runs(node) -> list[dict]:
    """Every dict in the JSON that has a ``parameters`` key."""
    found = []
    if isinstance(node, dict):
        found += [node] if "parameters" in node else []
        for value in node.values():
            found += _runs(value)
    elif isinstance(node, list):
        for value in node:
            found += _runs(value)
    return found


def test_concepts_tensor_parallel_shows_the_matrix_split():
    tp = re.split(r"^### ", _read("concepts.md"), flags=re.MULTILINE)
    section = next(p for p in tp if p.startswith("Tensor parallel"))
    for needed in ("`A = [A1 | A2]`", "**by columns**", "`B = [B1; B2]`", "**by rows**",
                   "**partial sum**", "`Y = [H1 | H2]·[B1; B2] = H1·B1 + H2·B2`",
                   "**all-reduce**"):
        assert needed in section, needed
    assert "concepts.md#tensor-parallel" in _section(_read("tutorial.md"), "5. Tensor")


# --- items 8, 10, 13 ------------------------------------------------------------------------
def test_readme_prepares_xsum_before_the_headline_run():
    readme = (REPO / "README.md").read_text()
    prepare = readme.index("apptainer run containers/ddl.sif prepare --plugin xsum --synthetic")
    train = readme.index("apptainer run containers/ddl.sif train --site lumi --plugin xsum")
    assert prepare < train


def test_readme_and_testing_say_why_the_venv_has_cuda_torch():
    anchor = "why-the-venv-holds-pypis-cuda-torch-and-a-lighter-one-by-hand"
    assert f"docs/testing.md#{anchor}" in (REPO / "README.md").read_text()
    section = _section(_read("testing.md"), "Dependencies and the lock")
    assert "### Why the venv holds PyPI's CUDA torch, and a lighter one by hand" in section
    assert "--index-url https://download.pytorch.org/whl/cpu" in section


def test_containers_md_does_not_claim_network_none_stops_a_run():
    text = _read("containers.md")
    paragraph = " ".join(next(p for p in text.split("\n- ") if "--network none" in p).split())
    assert "still trains" in paragraph and "loopback interface is up" in paragraph
