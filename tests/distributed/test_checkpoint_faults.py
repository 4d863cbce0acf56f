"""Damaged and crafted checkpoints through the real CLI (issue 21, acceptance 1 and 2).

One real 2-rank FSDP run (MNIST tiny, 10 steps, a checkpoint after every step) is trained
once per module. A copy then gets one fault per checkpoint, newest first: every damaged-file
kind of the issue, a crafted pickle in ``.metadata`` and in an RNG file (with the manifest
rewritten to match, so only the allow-list / weights-only load stands in the way), and a
``latest`` that names a checkpoint outside the run directory. ``--resume auto`` must skip each
damaged one with exactly one line, continue from the intact ``step-1`` and end bit-identical
to the trained run, which is the uninterrupted continuation of ``step-1`` (that a resume by
name is bit-identical to it is tests/distributed/test_checkpoint.py's mid-epoch test; one
launch fewer here). No crafted pickle may run.
"""

import json
import os
import shutil

import pytest
import torch
from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.distributed

STEPS = 12
ARGS = ["train", "--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "64",
        "--epochs", "1", "--steps-per-epoch", str(STEPS), "--seed", "7", "--nproc", "2",
        "--strategy", "fsdp", "--checkpoint-every", "1", "--keep-checkpoints", str(STEPS)]


class _Payload:
    """Unpickling this creates ``target``: what a crafted checkpoint would do."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def _ckpt(run_dir, step):
    return run_dir / "checkpoints" / f"step-{step:08d}"


def _train(data, run_dir, *extra):
    proc = run_ddl(*ARGS, "--data-dir", str(data), "--run-dir", str(run_dir), *extra,
                   cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _rewrite_manifest(path):
    """What someone who may write the checkpoint can do: make the manifest match again."""
    from ddl.worker.checkpointing import checkpoint_manifest as manifest

    manifest.write(path, manifest.entries(path, manifest.file_names(path)))


def _truncate(file, keep=None):
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2 if keep is None else keep])


def _flip(file):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _craft_metadata(path, target):
    import pickle

    (path / ".metadata").write_bytes(pickle.dumps(_Payload(target)))
    _rewrite_manifest(path)


def _craft_rng(path, target):
    torch.save({"torch": _Payload(target)}, path / "rng-00001.pt")
    _rewrite_manifest(path)


def _craft_trainer(path):
    """A position far beyond the epoch (it would skip the epoch, count samples negative)."""
    state = json.loads((path / "trainer.json").read_text())
    (path / "trainer.json").write_text(json.dumps({**state, "position": 10 ** 12}))
    _rewrite_manifest(path)


def _craft_bytes_item(path, target):
    """A non-tensor DCP item (an optimizer hyper-parameter) replaced by a pickle that would
    run code, appended to its data file, with .metadata and the manifest made to match."""
    import io
    import pickle

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from ddl.worker.checkpointing import safe_load

    metadata = safe_load.read_metadata(path)
    index = next(i for i in sorted(metadata.storage_data, key=lambda i: i.fqn)
                 if isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata))
    info = metadata.storage_data[index]
    buffer = io.BytesIO()
    torch.save({"lr": _Payload(target)}, buffer)
    with open(path / info.relative_path, "ab") as f:
        info.offset, info.length = f.tell(), len(buffer.getvalue())
        f.write(buffer.getvalue())
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    _rewrite_manifest(path)


def _mistype_trainer(path):
    state = json.loads((path / "trainer.json").read_text())
    (path / "trainer.json").write_text(json.dumps({**state, "step": str(state["step"])}))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synthetic_mnist):
    root = tmp_path_factory.mktemp("faults")
    _train(synthetic_mnist, root / "trained")
    return root


def _interrupted_copy(trained, name):
    """The trained run as a requeued job finds it: checkpoints, no results yet."""
    run_dir = trained / name
    shutil.copytree(trained / "trained", run_dir)
    (run_dir / "results.json").unlink()
    (run_dir / "model.pt").unlink()
    return run_dir


def test_resume_auto_skips_each_damaged_checkpoint_in_one_line(trained, synthetic_mnist):
    run_dir = _interrupted_copy(trained, "damaged")
    created = trained / "pwned"  # what a crafted pickle would create
    faults = {  # step: (damage, a word the skip line must hold)
        12: (_craft_trainer, "position 1000000000000 is beyond step 12"),
        11: (lambda p: _craft_bytes_item(p, created), "does not load weights-only"),
        10: (lambda p: _truncate(p / "__0_0.distcp"), "__0_0.distcp is"),
        9: (lambda p: _flip(p / "__1_0.distcp"), "__1_0.distcp does not match its sha256"),
        8: (lambda p: _truncate(p / ".metadata"), ".metadata is"),
        7: (lambda p: _truncate(p / ".metadata", keep=0), ".metadata is 0 bytes"),
        6: (lambda p: _truncate(p / "trainer.json"), "trainer.json is"),
        5: (_mistype_trainer, "trainer.json"),
        4: (lambda p: _truncate(p / "rng-00001.pt"), "rng-00001.pt is"),
        3: (lambda p: _craft_metadata(p, created), "refused"),
        2: (lambda p: _craft_rng(p, created), "rng-00001.pt is not a weights-only file"),
    }
    for step, (damage, _) in faults.items():
        damage(_ckpt(run_dir, step))
    elsewhere = trained / "elsewhere"  # an intact checkpoint outside the run directory
    shutil.copytree(_ckpt(trained / "trained", STEPS), elsewhere / "step-00000099")
    (run_dir / "checkpoints" / "latest").write_text(str(elsewhere / "step-00000099"))
    stale = run_dir / "checkpoints" / ".step-00000013.partial"  # a kill's, another cadence
    shutil.copytree(_ckpt(trained / "trained", STEPS), stale)

    proc = _train(synthetic_mnist, run_dir, "--resume", "auto")

    skipped = [line for line in proc.stdout.splitlines() if "skipping checkpoint" in line]
    assert len(skipped) == len(faults), proc.stdout
    for line, (step, (_, reason)) in zip(skipped, faults.items()):
        assert f"step-{step:08d}:" in line and reason in line, (step, line)
    ignored = [line for line in proc.stdout.splitlines() if "ignoring" in line]
    assert len(ignored) == 1 and "latest" in ignored[0], proc.stdout  # not followed:
    assert f"resumed from {_ckpt(run_dir, 1)} (step 1" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not created.exists()
    assert not stale.exists()  # removed at the start (issue 43, item 11)

    got = torch.load(run_dir / "model.pt", weights_only=True)
    want = torch.load(trained / "trained" / "model.pt", weights_only=True)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_naming_a_crafted_checkpoint_fails_in_one_line_and_runs_nothing(trained,
                                                                       synthetic_mnist):
    run_dir = _interrupted_copy(trained, "named")
    created = trained / "pwned-named"
    _craft_metadata(_ckpt(run_dir, STEPS), created)
    proc = run_ddl(*ARGS, "--data-dir", str(synthetic_mnist), "--run-dir",
                   str(trained / "fresh"),
                   "--resume", str(_ckpt(run_dir, STEPS)), cwd=trained)
    assert_one_line_error(proc, "--resume", f"step-{STEPS:08d}", ".metadata", "refused")
    assert not created.exists()


def test_load_model_weights_refuses_crafted_and_damaged_checkpoints(trained):
    """In-process: the inference/export path verifies and allow-lists as a resume does."""
    from ddl.contract.errors import UsageError
    from ddl.worker.checkpointing.checkpoint_choice import load_model_weights
    from ddl_mnist.plugin import PRESETS
    from ddl_mnist.workload import MnistWorkload

    model = MnistWorkload(PRESETS["tiny"]).build_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    crafted = trained / "crafted-for-load"
    shutil.copytree(_ckpt(trained / "trained", STEPS), crafted)
    created = trained / "pwned-load"
    _craft_metadata(crafted, created)
    with pytest.raises(UsageError, match=r"not loaded: \.metadata asks to load io\.open"):
        load_model_weights(crafted, model)
    flipped = trained / "flipped-for-load"
    shutil.copytree(_ckpt(trained / "trained", STEPS), flipped)
    _flip(flipped / "__0_0.distcp")
    with pytest.raises(UsageError, match="__0_0.distcp does not match its sha256"):
        load_model_weights(flipped, model)
    assert not created.exists()
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)
    load_model_weights(_ckpt(trained / "trained", STEPS), model)  # the intact one loads
    exported = torch.load(trained / "trained" / "model.pt", weights_only=True)
    assert all(torch.equal(model.state_dict()[k], exported[k]) for k in exported)
    assert os.listdir(trained / "trained" / "checkpoints")  # nothing was removed
