"""Checkpoint manifests, the allow-listing metadata reader and the choice of checkpoint,
on checkpoints written in-process by the real DCP (one process, no process group)."""

import json
import pickle
import warnings

import pytest

from ddl.contract.errors import UsageError
from ddl.worker.checkpointing import checkpoint, checkpoint_choice, checkpoint_manifest, safe_load

pytestmark = pytest.mark.unit


class _Payload:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def _files(tmp_path, **contents):
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    checkpoint_manifest.write(tmp_path, checkpoint_manifest.entries(
        tmp_path, checkpoint_manifest.file_names(tmp_path)))
    return tmp_path


def _real_checkpoint(run_dir, step):
    """A checkpoint as ddl writes one: DCP shards + .metadata, trainer.json, an RNG file,
    the manifest last."""
    import torch
    import torch.distributed.checkpoint as dcp

    path = run_dir / "checkpoints" / f"step-{step:08d}"
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"w": torch.full((4,), float(step))}, "optim": {"lr": 0.1}},
                 checkpoint_id=path)
    state = checkpoint.TrainerState(step=step, epoch=1, position=step, global_batch=8,
                                    world_size=1)
    (path / "trainer.json").write_text(json.dumps(state.__dict__))
    torch.save(checkpoint.rng_states(), path / "rng-00000.pt")
    checkpoint_manifest.write(path, checkpoint_manifest.entries(
        path, checkpoint_manifest.file_names(path)))
    (run_dir / "checkpoints" / "latest").write_text(path.name)
    return path


def test_manifest_verifies_and_names_each_kind_of_damage(tmp_path):
    path = _files(tmp_path, a=b"0123456789", b=b"abcdef")
    assert checkpoint_manifest.problem(path) is None
    (path / "a").write_bytes(b"01234")
    assert checkpoint_manifest.problem(path) == "a is 5 bytes, the manifest says 10"
    (path / "a").write_bytes(b"0123456780")  # same size, one byte changed
    assert checkpoint_manifest.problem(path) == "a does not match its sha256 in the manifest"
    (path / "a").unlink()
    assert "a is missing" in checkpoint_manifest.problem(path)
    (path / "a").write_bytes(b"0123456789")
    (path / "extra").write_bytes(b"")
    assert checkpoint_manifest.problem(path) == "extra is not in manifest.json"
    (path / "extra").unlink()
    (path / "elsewhere").symlink_to("/etc/hostname")  # a link out, unlisted: not read
    assert checkpoint_manifest.problem(path) == "elsewhere is not in manifest.json"


def test_checksums_are_shared_among_ranks(tmp_path):
    path = _files(tmp_path, a=b"0123456789", b=b"abcdef")
    (path / "b").write_bytes(b"abcdeX")  # sorted ["a", "b"]: rank 1 hashes b
    assert checkpoint_manifest.problem(path, rank=0, world_size=2) is None
    assert "b does not match" in checkpoint_manifest.problem(path, rank=1, world_size=2)


@pytest.mark.parametrize("body, needle", [
    (None, "no manifest.json"),
    (b"{not json", "malformed"),
    (json.dumps({"files": [{"path": "../x", "size": 1, "sha256": "0"}]}).encode(),
     "not a file of the checkpoint directory"),
])
def test_missing_malformed_or_escaping_manifest(tmp_path, body, needle):
    (tmp_path / "a").write_bytes(b"1")
    if body is not None:
        (tmp_path / checkpoint_manifest.MANIFEST).write_bytes(body)
    assert needle in checkpoint_manifest.problem(tmp_path)


def test_metadata_unpickler_reads_dcp_metadata_and_refuses_code(tmp_path):
    path = _real_checkpoint(tmp_path, 1)
    assert "model.w" in str(safe_load.read_metadata(path).state_dict_metadata)
    created = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Payload(created)))
    with pytest.raises(safe_load.UnsafeCheckpoint, match="io.open.*refused"):
        safe_load.read_metadata(path)
    # protocol 4 may name an attribute of an allowed class: still refused
    dotted = b"\x80\x04\x8c\x07pathlib\x8c\x0fPosixPath.touch\x93."
    (path / ".metadata").write_bytes(dotted)
    with pytest.raises(safe_load.UnsafeCheckpoint, match="PosixPath.touch"):
        safe_load.read_metadata(path)
    assert not created.exists()


def test_metadata_naming_a_data_file_outside_is_refused(tmp_path):
    path = _real_checkpoint(tmp_path, 1)
    metadata = safe_load.read_metadata(path)
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(safe_load.UnsafeCheckpoint, match="elsewhere.distcp"):
        safe_load.read_metadata(path)


def test_rng_file_with_code_is_refused(tmp_path):
    import torch

    created = tmp_path / "pwned"
    torch.save({"torch": _Payload(created)}, tmp_path / "rng-00000.pt")
    with pytest.raises(safe_load.UnsafeCheckpoint, match="rng-00000.pt is not a weights-only"):
        safe_load.load_weights_only(tmp_path / "rng-00000.pt")
    assert not created.exists()


def test_mistyped_trainer_state_is_one_line(tmp_path):
    (tmp_path / "trainer.json").write_text(json.dumps(
        {"step": "3", "epoch": 1, "position": 0, "global_batch": 8, "world_size": 1}))
    with pytest.raises(ValueError, match="step is '3', not int"):
        checkpoint.read_trainer_state(tmp_path)
    (tmp_path / "trainer.json").write_text('{"step": 3')
    with pytest.raises(ValueError, match="not a trainer state"):
        checkpoint.read_trainer_state(tmp_path)


def test_latest_is_followed_only_inside_the_run_directory(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    own = _real_checkpoint(run, 1)
    foreign = _real_checkpoint(other, 5)
    pointer = run / "checkpoints" / "latest"
    for text in (str(foreign), f"../../other/checkpoints/{foreign.name}"):
        pointer.write_text(text)
        assert checkpoint.pointed(run) is None
        assert checkpoint.latest(run) == own
    (run / "checkpoints" / "step-00000009").symlink_to(foreign)  # a link leading out
    pointer.write_text("step-00000009")
    assert checkpoint.pointed(run) is None and checkpoint.steps(run) == [own]
    said = []
    assert checkpoint_choice.choose("auto", run, say=said.append) == own
    assert len(said) == 1 and "ignoring" in said[0]


def test_choose_skips_damaged_newer_checkpoints_with_one_line_each(tmp_path):
    one = _real_checkpoint(tmp_path, 1)
    two = _real_checkpoint(tmp_path, 2)
    three = _real_checkpoint(tmp_path, 3)
    (three / "rng-00000.pt").write_bytes(b"12")
    (two / checkpoint_manifest.MANIFEST).unlink()  # as written before manifests existed
    said = []
    assert checkpoint_choice.choose("auto", tmp_path, say=said.append) == one
    rng_size = json.loads((three / "manifest.json").read_text())["files"][-2]["size"]
    assert said == [
        ("ddl: skipping checkpoint step-00000003: rng-00000.pt is 2 bytes, the manifest says "
         f"{rng_size}"),
        ("ddl: skipping checkpoint step-00000002: it has no manifest.json (written by an older "
         "ddl, or not finished)")]
    with pytest.raises(UsageError, match="--resume: checkpoint .*step-00000003 does not "
                                         "verify: rng-00000.pt is 2 bytes"):
        checkpoint_choice.choose(str(three), tmp_path / "other")
    assert checkpoint_choice.choose(str(one), tmp_path / "other") == one
    (one / "trainer.json").write_text("{}")
    with pytest.raises(UsageError, match="--resume auto: no checkpoint in .* verifies"):
        checkpoint_choice.choose("auto", tmp_path, say=said.append)


def test_choose_takes_the_newest_checkpoint_when_latest_lags_behind(tmp_path):
    """Ctrl-C between the rename and the pointer's update leaves ``latest`` naming the one
    before (and a .latest.tmp): the newest verified checkpoint is used, and one line says
    that ``latest`` lagged (issue 43, item 8)."""
    _real_checkpoint(tmp_path, 1)
    two = _real_checkpoint(tmp_path, 2)
    root = tmp_path / "checkpoints"
    (root / "latest").write_text("step-00000001")
    (root / ".latest.tmp").write_text("step-00000002")
    said = []
    assert checkpoint_choice.choose("auto", tmp_path, say=said.append) == two
    assert checkpoint.latest(tmp_path) == two
    assert len(said) == 1 and "names step-00000001, but step-00000002 is newer" in said[0]


def _rewrite_trainer(path, **changes):
    state = json.loads((path / "trainer.json").read_text())
    (path / "trainer.json").write_text(json.dumps({**state, **changes}))
    checkpoint_manifest.write(path, checkpoint_manifest.entries(
        path, checkpoint_manifest.file_names(path)))


@pytest.mark.parametrize("changes, reason", [
    ({"position": 10 ** 12}, "position 1000000000000 is beyond step 3"),
    ({"step": -1, "position": 0}, "step is -1, below 0"),
    ({"epoch": 0}, "epoch is 0, below 1"),
    ({"steps_per_epoch": 3}, "position 3 is outside an epoch of 3 steps"),
    ({"global_batch": 0}, "global_batch is 0, below 1"),
])
def test_a_trainer_state_with_impossible_counts_does_not_verify(tmp_path, changes, reason):
    """Crafted (manifest rewritten to match): the resume falls back to the older checkpoint
    instead of skipping an epoch and counting samples negative (issue 43, item 9)."""
    one = _real_checkpoint(tmp_path, 1)
    _rewrite_trainer(_real_checkpoint(tmp_path, 3), **changes)
    said = []
    assert checkpoint_choice.choose("auto", tmp_path, say=said.append) == one
    assert said == [f"ddl: skipping checkpoint step-00000003: trainer.json: {reason}"]


def test_a_crafted_non_tensor_item_does_not_verify_and_runs_nothing(tmp_path):
    """A DCP bytes item (here ``optim.lr``) replaced by a pickle that would run code, with
    .metadata and the manifest made to match: the checkpoint does not verify, so the resume
    takes the older one instead of failing halfway through loading (issue 43, item 10)."""
    import io

    import torch

    one = _real_checkpoint(tmp_path, 1)
    two = _real_checkpoint(tmp_path, 2)
    created = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"lr": _Payload(created)}, buffer)
    metadata = safe_load.read_metadata(two)
    [(index, info)] = [(i, s) for i, s in metadata.storage_data.items() if i.fqn == "optim.lr"]
    with open(two / info.relative_path, "ab") as f:  # appended; the metadata points at it
        info.offset, info.length = f.tell(), len(buffer.getvalue())
        f.write(buffer.getvalue())
    (two / ".metadata").write_bytes(pickle.dumps(metadata))
    checkpoint_manifest.write(two, checkpoint_manifest.entries(
        two, checkpoint_manifest.file_names(two)))
    said = []
    assert checkpoint_choice.choose("auto", tmp_path, say=said.append) == one
    assert len(said) == 1 and f"item optim.lr of {info.relative_path} does not load " \
        "weights-only (UnpicklingError)" in said[0], said
    assert not created.exists()
    with pytest.raises(UsageError, match="not loaded: item optim.lr"):
        checkpoint_choice.load_model_weights(two, torch.nn.Linear(1, 1))
