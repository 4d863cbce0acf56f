"""The CPU image, built and run with a real Apptainer (Debian sid's 1.4, provided on this
Debian 12 machine by ../shared/tools/provide-apptainer, which also makes the Debian 12 Python
root used as the `Bootstrap: localimage` base: registries are unreachable here).

One build per session, through `ddl container build` exactly as docs/containers.md
describes (an offline wheelhouse with the CPU torch, so the build installs from the
wheelhouse only). Then, against that image:
- its size is at most 2.5 GB (uncompressed squashfs: what this test builds);
- the headline command's shape, `apptainer run IMAGE train --site lumi --plugin xsum
  --device cpu --preset tiny`, trains on data the image's own `prepare` made, and the
  results land on the host;
- `apptainer run IMAGE train --site local --plugin mnist --preset tiny --nproc 2` trains
  with the image's ddl and writes results.json outside the image, and the image's
  `report` draws the run's report.html;
- the image knows its target: DDL_CONTAINER_TARGET and /opt/ddl/target say cpu;
- `apptainer test` passes; `apptainer inspect` shows the ddl labels;
- the image's `ddl sites` lists every profile in sites/ (packaged inside the image).
And without the image: a broken definition is refused by `ddl container check` and, handed
to the real build unchecked, by Apptainer itself, whose error ddl repeats.

The Apptainer, the base and the image come from tests/system/conftest.py (one image build
per test run, shared with the other system test files). Not covered here
(no GPU, no registry): the CUDA and ROCm images, --nv/--rocm, docker:// bases.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from ddl import __version__

from .conftest import APPTAINER_DIR, CPU_TORCH
from .conftest import apptainer as _apptainer

TORCH_VERSION = CPU_TORCH[0].split("==")[1]  # the torch the image was built with
MAX_IMAGE_BYTES = 2.5e9
# The headline run cut short: 4 of 64 steps per epoch, 16 of 128 validation and test
# samples (ROUGE scores the preset's first 16 test articles either way).
QUICK_XSUM = ("--steps-per-epoch", "4", "--eval-samples", "16")

pytestmark = pytest.mark.system


def _results_on_the_host(proc: subprocess.CompletedProcess, cwd: Path) -> dict:
    """The run succeeded and its results.json (the `results:` line) is a file under the
    host directory it ran from, not somewhere inside the image."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(r"^results: (\S+)$", proc.stdout, re.M)
    assert match, proc.stdout
    results_file = cwd / match.group(1)
    assert results_file.is_file() and results_file.is_relative_to(cwd)
    return json.loads(results_file.read_text())


def test_main_job_trains_in_the_image_and_writes_results_outside(runtime_env, image,
                                                                tmp_path):
    proc = _apptainer(runtime_env, "run", str(image), "train", "--site", "local", "--plugin",
                      "mnist", "--preset", "tiny", "--nproc", "2", cwd=tmp_path)
    results = _results_on_the_host(proc, tmp_path)
    # the image's ddl ran (its console script, installed from its wheel), and results.json
    # names the user's command line, not a worker's argv
    assert results["command"][0] == "/usr/local/bin/ddl", results["command"]
    assert results["command"][1:4] == ["train", "--site", "local"], results["command"]
    assert results["world"] == {"size": 2, "dp_size": 2, "backend": "gloo", "device": "cpu",
                                "parallel": {"pp": 1, "dp_replicate": 2, "dp_shard": 1,
                                             "tp": 1}}
    assert results["data"] == {"dir": str(tmp_path / "data"), "synthetic": True}
    assert results["versions"]["torch"] == TORCH_VERSION
    # the image it ran in, traceable to the ddl commit it was built from (issue 42)
    container = results["container"]
    assert (container["runtime"], container["image"], container["target"]) == (
        "apptainer", str(image), "cpu"), container
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", container["commit"]), container
    assert container["file"]["size"] == image.stat().st_size, container
    assert len(results["epochs"]) == 2
    # It learned (docs/testing.md, "How learning thresholds are chosen"): the same command
    # with the host's ddl, seeds 1-5; untrained: the highest of the model before any step
    # seeds 1-5: 0.830-0.886; untrained 0.14
    assert results["final"]["test"]["accuracy"] > 0.35, results["final"]
    # The image's `report` draws it (matplotlib is in the image: issue 42)
    run_dir = Path(re.search(r"^results: (\S+)$", proc.stdout, re.M).group(1)).parent
    report = _apptainer(runtime_env, "run", str(image), "report", str(run_dir), "--output",
                        str(run_dir), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    html = (tmp_path / run_dir / "report.html").read_text()
    assert "data:image/png;base64," in html  # a drawn figure, not only tables


def test_cpu_image_is_at_most_2_5_gb(image):
    """Uncompressed squashfs (--no-compress, as built here): the upper bound of the
    download; PyPI's CUDA torch made it 6.1 GB, 4.1 GB of CUDA libraries."""
    size = image.stat().st_size
    print(f"CPU image: {size / 1e9:.2f} GB")
    assert size <= MAX_IMAGE_BYTES, f"{size / 1e9:.2f} GB"


def test_headline_command_shape_trains_xsum_for_lumi_on_cpu(runtime_env, image, tmp_path):
    """`apptainer run containers/ddl.sif train --site lumi --plugin xsum`, on this CPU:
    the LUMI profile (short name), the xsum workload, data prepared by the image itself.
    A few steps per epoch and a 16-sample evaluation (the quick-check flags): what is
    checked here is that the image runs the workload (tokenizer, T5, ROUGE's greedy
    summaries of the test split: the preset's 16 articles either way), not that it learns;
    the whole tiny run and its learning are tests/distributed/test_xsum_train.py's, on the
    host. The whole preset (3 x 64 steps, 128-sample evaluations) took 146 s alone on the
    loaded 2-core machine and 510 s in a system phase; cut short, 24 s (2026-11-29)."""
    data = tmp_path / "xsum-data"
    prepare = _apptainer(runtime_env, "run", str(image), "prepare", "--plugin", "xsum",
                         "--synthetic", "--data-dir", str(data), cwd=tmp_path)
    assert prepare.returncode == 0, prepare.stdout + prepare.stderr
    proc = _apptainer(runtime_env, "run", str(image), "train", "--site", "lumi", "--plugin",
                      "xsum", "--device", "cpu", "--preset", "tiny", "--nproc", "1",
                      "--data-dir", str(data), *QUICK_XSUM, cwd=tmp_path, timeout=1200)
    results = _results_on_the_host(proc, tmp_path)
    assert results["command"][0] == "/usr/local/bin/ddl", results["command"]  # the image's
    assert results["world"]["device"] == "cpu" and results["world"]["size"] == 1
    assert results["data"]["dir"] == str(data)
    assert len(results["epochs"]) == 3  # the preset's epochs, each cut short
    test = results["final"]["test"]
    assert test["loss"] > 0
    # the image's rouge-score and tokenizer scored the greedy summaries
    assert {"rouge1", "rouge2", "rougeL"} <= set(test), test


def test_image_knows_its_target(runtime_env, image, tmp_path):
    proc = _apptainer(runtime_env, "exec", str(image), "sh", "-c",
                      'echo "$DDL_CONTAINER_TARGET $(cat /opt/ddl/target)"', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "cpu"]


def test_apptainer_test_runs_the_smoke_check(runtime_env, image):
    proc = _apptainer(runtime_env, "test", str(image))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ddl {__version__}" in proc.stdout
    assert "gloo all_reduce ok" in proc.stdout


def test_inspect_shows_the_ddl_labels(runtime_env, image):
    proc = _apptainer(runtime_env, "inspect", "--labels", str(image))
    assert proc.returncode == 0, proc.stderr
    labels = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert labels["ddl.version"] == __version__
    assert labels["ddl.target"] == "cpu"
    # the checkout's commit at build time (HEAD itself, unless a commit landed since)
    commit = labels["ddl.commit"].removesuffix("-dirty")
    ancestor = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor",
                               commit, "HEAD"], capture_output=True, text=True)
    assert re.fullmatch(r"[0-9a-f]{7,}", commit) and ancestor.returncode == 0, labels
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["ddl.built"])
    assert labels["ddl.base"] == f"localimage:{APPTAINER_DIR / 'base'}"
    assert labels["ddl.torch"] == TORCH_VERSION
    assert labels["org.opencontainers.image.revision"] == labels["ddl.commit"]
    assert labels["org.opencontainers.image.version"] == __version__
    run_help = _apptainer(runtime_env, "run-help", str(image))
    assert "apptainer run containers/ddl.sif train --site lumi --plugin xsum" in run_help.stdout


def test_image_lists_every_site_profile_from_inside(runtime_env, image, tmp_path):
    proc = _apptainer(runtime_env, "run", str(image), "sites", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    shipped = {path.stem for path in (REPO / "sites").glob("*.toml")}
    assert shipped <= set(listed), (shipped - set(listed), proc.stdout)
    for name in shipped:  # read from the wheel's copy inside the image, not the checkout
        assert f"/ddl/_sites/{name}.toml]" in listed[name], listed[name]
        assert str(REPO) not in listed[name]
        assert "INVALID" not in listed[name]


BROKEN = {
    "unknown-section": ("Bootstrap: localimage\nFrom: {base}\n\n%psot\n    true\n",
                        "x.def:4: unknown section %psot",
                        "invalid section(s) specified: psot"),
    "no-header": ("%post\n    true\n", "x.def:1: no header before the first section",
                  "all must have headers"),
    "no-bootstrap": ("From: {base}\n\n%post\n    true\n", "x.def:1: the header has no "
                     "'Bootstrap:' line", "no bootstrap specification found"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_definition_is_caught_by_check_and_by_the_real_build(runtime_env, tmp_path,
                                                                    case):
    text, ours, apptainers = BROKEN[case]
    definition = tmp_path / "x.def"
    definition.write_text(text.format(base=APPTAINER_DIR / "base"))
    wheelhouse = tmp_path / "wheelhouse"  # the definitions do not use it
    check = run_ddl("container", "check", "--def", str(definition),
                    "--wheelhouse", str(wheelhouse), env=runtime_env)
    assert_one_line_error(check, ours)

    build = run_ddl("container", "build", "--no-check", "--def", str(definition),
                    "--wheelhouse", str(wheelhouse), "--output", str(tmp_path / "x.sif"),
                    cwd=tmp_path, env=runtime_env, timeout=300)
    assert build.returncode == 1, build.stdout + build.stderr
    assert "FATAL:" in build.stderr and apptainers in build.stderr  # shown as it came
    last = build.stderr.strip().splitlines()[-1]
    assert last.startswith("ddl: error: apptainer build failed (exit 255): "), last
    assert apptainers in last
    assert not (tmp_path / "x.sif").exists()
