"""results.json's `container` (ddl.worker.observe.container_record): which image a run ran in and
the ddl commit that image was built from (issue 42). Against the real runtime:
tests/system/test_container.py."""

import json

import pytest

from ddl.worker.observe.container_record import record

pytestmark = pytest.mark.unit


def test_outside_a_container_there_is_none(tmp_path):
    assert record({}, tmp_path / "labels.json") is None


def test_inside_the_image_its_labels_and_file_are_recorded(tmp_path):
    image = tmp_path / "ddl.sif"
    image.write_bytes(b"x" * 10)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"ddl.commit": "a7434a8-dirty", "ddl.built":
                                  "2026-11-30T10:00:00Z", "ddl.version": "0.1.0"}))
    got = record({"APPTAINER_CONTAINER": str(image), "SINGULARITY_CONTAINER": str(image),
                  "DDL_CONTAINER_TARGET": "cpu"}, labels)
    assert got["runtime"] == "apptainer" and got["image"] == str(image)
    assert (got["target"], got["commit"], got["built"], got["ddl_version"]) == (
        "cpu", "a7434a8-dirty", "2026-11-30T10:00:00Z", "0.1.0")
    assert got["file"]["size"] == 10 and got["file"]["mtime"][:4].isdigit()


def test_an_image_ddl_did_not_build_and_an_unbound_file_are_nulls(tmp_path):
    got = record({"SINGULARITY_CONTAINER": "/appl/images/x.sif"}, tmp_path / "none.json")
    assert got == {"runtime": "singularity", "image": "/appl/images/x.sif", "target": None,
                   "commit": None, "built": None, "ddl_version": None, "file": None}
