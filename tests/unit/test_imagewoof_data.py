"""Imagewoof on disk: the synthetic JPEGs are read by torchvision's ImageFolder, the checks
catch damaged files in one line, and the real download resumes, unpacks safely and
verifies the image counts (against a local HTTP server; the real one is unreachable here)."""

import io
import shutil
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from PIL import Image

from ddl.contract.errors import DataError, DataMissing, DdlError
from ddl_imagewoof import data, synthetic
from ddl_imagewoof.plugin import PRESETS
from ddl_imagewoof.workload import ImagewoofWorkload

pytestmark = pytest.mark.unit

TRAIN_PER_CLASS, VAL_PER_CLASS = 60, 20


@pytest.fixture(scope="session")
def imagewoof_synthetic(tmp_path_factory) -> Path:
    """One small synthetic Imagewoof per session (also used by the CLI tests)."""
    root = tmp_path_factory.getbasetemp() / "imagewoof-synthetic"
    if not data.is_synthetic(root):
        synthetic.write_synthetic(root, TRAIN_PER_CLASS, VAL_PER_CLASS, seed=0)
    return root


@pytest.fixture
def imagewoof_copy(imagewoof_synthetic, tmp_path) -> Path:
    target = tmp_path / "data"
    shutil.copytree(imagewoof_synthetic, target)
    return target


# --- the synthetic set in the real layout ---------------------------------------------------


def test_synthetic_files_are_real_jpegs_in_the_imagewoof_layout(imagewoof_synthetic):
    top = imagewoof_synthetic / "imagewoof2-320"
    assert (top / "SYNTHETIC.txt").is_file() and data.is_synthetic(imagewoof_synthetic)
    for split, n in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        assert sorted(p.name for p in (top / split).iterdir()) == list(data.WNIDS)
        for wnid in data.WNIDS:
            assert len(list((top / split / wnid).glob("*.JPEG"))) == n
    sample = next((top / "train" / "n02111889").glob("*.JPEG"))
    assert sample.name.startswith("n02111889_")
    assert next((top / "val" / "n02086240").glob("*.JPEG")).name.startswith("ILSVRC2012_val_")
    with Image.open(sample) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and min(im.size) == 320
        assert 1.0 <= max(im.size) / 320 <= 1.5


def test_imagefolder_reads_the_synthetic_set(imagewoof_synthetic):
    from torchvision.datasets import ImageFolder

    folder = ImageFolder(str(imagewoof_synthetic / "imagewoof2-320" / "train"))
    assert folder.classes == list(data.WNIDS)
    assert len(folder) == 10 * TRAIN_PER_CLASS
    image, label = folder[len(folder) - 1]  # default PIL loader
    assert label == 9 and image.size[1] >= 320


def with_options(preset: str, **options) -> ImagewoofWorkload:
    base = PRESETS[preset]
    return ImagewoofWorkload(base.__class__(**{**base.__dict__,
                                               "options": {**base.options, **options}}))


def model_input(workload: ImagewoofWorkload, dataset, index: int) -> torch.Tensor:
    """Sample ``index`` as the model sees it: collated, then through to_device (where the
    decode-cache path crops, flips and normalises)."""
    from torch.utils.data import default_collate

    inputs, _ = workload.to_device(default_collate([dataset[index]]), torch.device("cpu"))
    return inputs[0]


@pytest.mark.parametrize("decode_cache", [True, False], ids=["cache", "jpeg"])
def test_workload_splits_and_transforms(imagewoof_synthetic, decode_cache):
    workload = with_options("course", decode_cache=decode_cache)
    splits = workload.datasets(imagewoof_synthetic)
    n = 10 * TRAIN_PER_CLASS
    assert len(splits["train"]) == n - n // 10 and len(splits["val"]) == n // 10
    assert len(splits["test"]) == 10 * VAL_PER_CLASS  # Imagewoof's val folder
    assert set(splits["train"].indices).isdisjoint(splits["val"].indices)
    # every 10th image in ImageFolder's order: each class keeps its share of held-out images
    val_labels = [splits["val"].dataset.targets[i] for i in splits["val"].indices]
    assert sorted(set(val_labels)) == list(range(10))
    assert all(val_labels.count(c) == TRAIN_PER_CLASS // 10 for c in range(10))
    x, y = model_input(workload, splits["train"], 0), splits["train"][0][1]
    assert x.shape == (3, 160, 160) and x.dtype == torch.float32 and y == 0
    # eval transform is deterministic (resize + centre crop), training is random (the
    # cache's crops: per epoch, see test_imagewoof_cache.py)
    v1, v2 = (model_input(workload, splits["val"], 3) for _ in range(2))
    assert torch.equal(v1, v2)
    t1 = model_input(workload, splits["train"], 3)
    if decode_cache:
        splits["train"].begin_epoch(1, 0)
    assert not torch.equal(t1, model_input(workload, splits["train"], 3))
    assert abs(v1.mean().item()) < 2 and 0.2 < v1.std().item() < 3  # ImageNet-normalised


def test_tiny_preset_caps_splits_over_all_classes(imagewoof_synthetic):
    workload = ImagewoofWorkload(PRESETS["tiny"])
    splits = workload.datasets(imagewoof_synthetic)
    assert model_input(workload, splits["train"], 0).shape == (3, 64, 64)
    # the caps (900/300) exceed this small set, so nothing is dropped
    assert len(splits["train"]) == 540 and len(splits["test"]) == 200
    capped = ImagewoofWorkload(PRESETS["tiny"].__class__(
        **{**PRESETS["tiny"].__dict__, "options": {**PRESETS["tiny"].options,
                                                   "train_samples": 50, "eval_samples": 20}}))
    small = capped.datasets(imagewoof_synthetic)
    labels = {small["train"].dataset.targets[i] for i in small["train"].indices}
    assert len(small["train"]) == 50 and len(small["test"]) == 20 and labels == set(range(10))


def test_synthetic_generation_is_deterministic_and_replaces_only_synthetic(tmp_path):
    a = synthetic.write_synthetic(tmp_path / "a", 2, 1, seed=3)
    b = synthetic.write_synthetic(tmp_path / "b", 3, 1, seed=3)
    name = "val/n02099601/ILSVRC2012_val_00000007.JPEG"
    assert (a / name).read_bytes() == (b / name).read_bytes()  # val independent of train size
    synthetic.write_synthetic(tmp_path / "a", 1, 1, seed=4)  # replacing a synthetic set is fine
    assert len(list((a / "train" / "n02086240").iterdir())) == 1
    assert not list((tmp_path / "a").glob(".imagewoof2-320-*"))  # no temporary leftovers
    (a / "SYNTHETIC.txt").unlink()  # now it looks like real data
    with pytest.raises(DataError, match="refusing to overwrite"):
        synthetic.write_synthetic(tmp_path / "a", 1, 1)


# --- checks -------------------------------------------------------------------------------


def test_check_passes_and_counts(imagewoof_synthetic):
    assert data.check_files(imagewoof_synthetic) == {"train": 600, "val": 200}
    ImagewoofWorkload(PRESETS["tiny"]).check_data(imagewoof_synthetic)


def test_missing_data_is_data_missing(tmp_path):
    with pytest.raises(DataMissing, match="ddl prepare --plugin imagewoof"):
        ImagewoofWorkload(PRESETS["tiny"]).check_data(tmp_path)


def _damage(top: Path, how: str) -> Path:
    cls = top / "train" / "n02093754"
    victim = sorted(cls.iterdir())[5]
    if how == "truncate":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif how == "not-jpeg":
        victim = top / "val" / "n02115641" / "ILSVRC2012_val_99999999.JPEG"
        victim.write_text("<html>403 Forbidden</html>\n")
    elif how == "png":
        Image.new("RGB", (8, 8)).save(victim, format="PNG")
    elif how == "empty":
        victim.write_bytes(b"")
    elif how == "extra-class":
        victim = top / "train" / "n02123045"
        victim.mkdir()
    elif how == "missing-class":
        shutil.rmtree(cls)
        victim = cls
    elif how == "empty-class":
        for p in cls.iterdir():
            p.unlink()
        victim = cls
    elif how == "no-val":
        shutil.rmtree(top / "val")
        victim = top / "val"
    return victim


@pytest.mark.parametrize("how", ["truncate", "not-jpeg", "png", "empty", "extra-class",
                                 "missing-class", "empty-class", "no-val"])
def test_damage_is_one_line_naming_the_file(imagewoof_copy, how):
    victim = _damage(imagewoof_copy / "imagewoof2-320", how)
    with pytest.raises(DataError) as info:
        data.check_files(imagewoof_copy)
    message = str(info.value)
    assert "\n" not in message and str(victim) in message
    assert f"ddl prepare --plugin imagewoof --data-dir {imagewoof_copy}" in message


def test_other_files_are_ignored_like_imagefolder_does(imagewoof_copy):
    (imagewoof_copy / "imagewoof2-320" / "train" / "n02086240" / "notes.txt").write_text("x")
    (imagewoof_copy / "imagewoof2-320" / "noisy_imagewoof.csv").write_text("path,label\n")
    data.check_files(imagewoof_copy)


def test_real_set_must_have_the_published_counts(imagewoof_copy):
    (imagewoof_copy / "imagewoof2-320" / "SYNTHETIC.txt").unlink()
    with pytest.raises(DataError, match=r"train holds 600 images, expected 9025"):
        data.check_files(imagewoof_copy)
    assert data.check_files(imagewoof_copy, expected={"train": 600, "val": 200})


# --- the real download, against a local server ----------------------------------------------


class _Server:
    """A loopback HTTP server for one payload; honours Range like S3 unless told not to."""

    def __init__(self, payload: bytes, honour_range: bool = True) -> None:
        self.payload, self.ranges = payload, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                asked = self.headers.get("Range")
                server.ranges.append(asked)
                body, status, extra = server.payload, 200, {}
                if asked and honour_range:
                    start = int(asked.removeprefix("bytes=").rstrip("-"))
                    if start >= len(server.payload):
                        self.send_response(416)
                        self.end_headers()
                        return
                    body, status = server.payload[start:], 206
                    extra["Content-Range"] = (f"bytes {start}-{len(server.payload) - 1}/"
                                              f"{len(server.payload)}")
                self.send_response(status)
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/imagewoof2-320.tgz"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> bytes:
    """A .tgz laid out like fastai's: imagewoof2-320/{train,val}/<wnid>/*.JPEG (+ the csv)."""
    src = tmp_path_factory.mktemp("archive-src")
    top = synthetic.write_synthetic(src, 2, 1, seed=1, short_side=64)
    (top / "SYNTHETIC.txt").unlink()
    (top / "noisy_imagewoof.csv").write_text("path,noisy_labels_0\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(top, arcname="imagewoof2-320")
    return buffer.getvalue()


EXPECTED = {"train": 20, "val": 10}


@pytest.fixture
def serve():
    servers = []

    def start(payload, **kw):
        servers.append(_Server(payload, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_download_resumes_unpacks_and_skips_when_complete(tmp_path, archive, serve, capsys):
    server = serve(archive)
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    cut = len(archive) * 2 // 5
    (data_dir / "imagewoof2-320.tgz.part").write_bytes(archive[:cut])  # interrupted before
    top = data.download(data_dir, url=server.url, expected=EXPECTED)
    assert server.ranges == [f"bytes={cut}-"]  # only the rest was fetched
    assert top == data_dir / "imagewoof2-320" and not data.is_synthetic(data_dir)
    assert data.check_files(data_dir, expected=EXPECTED) == EXPECTED
    assert sorted(p.name for p in data_dir.iterdir()) == ["imagewoof2-320"]  # archive removed
    data.download(data_dir, url=server.url, expected=EXPECTED)
    assert len(server.ranges) == 1 and "skipping download" in capsys.readouterr().out


def test_download_restarts_when_the_server_ignores_range(tmp_path, archive, serve):
    server = serve(archive, honour_range=False)
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    (data_dir / "imagewoof2-320.tgz.part").write_bytes(b"garbage from another file")
    data.download(data_dir, url=server.url, expected=EXPECTED)
    assert data.check_files(data_dir, expected=EXPECTED) == EXPECTED


def test_download_replaces_a_synthetic_set(imagewoof_copy, archive, serve):
    server = serve(archive)
    data.download(imagewoof_copy, url=server.url, expected=EXPECTED)
    assert not data.is_synthetic(imagewoof_copy)
    assert data.check_files(imagewoof_copy, expected=EXPECTED) == EXPECTED


def _tgz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return buffer.getvalue()


@pytest.mark.parametrize("payload, needle", [
    (b"<html>not an archive</html>", "damaged"),
    (_tgz({"../escape.txt": b"outside"}), "damaged"),  # the tarfile 'data' filter refuses it
    (_tgz({"imagewoof2-320/train/readme.txt": b"x"}), "failed validation"),
])
def test_bad_archives_fail_in_one_line_and_are_deleted(tmp_path, serve, payload, needle):
    server = serve(payload)
    data_dir = tmp_path / "d"
    with pytest.raises(DdlError) as info:
        data.download(data_dir, url=server.url, expected=EXPECTED)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "escape.txt").exists()
    assert sorted(p.name for p in data_dir.iterdir()) == []  # no archive, no partial set


def test_unreachable_server_is_one_line_and_keeps_the_partial_file(tmp_path, serve):
    server = serve(b"")
    url = server.url
    server.close()  # nothing listens there any more
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    (data_dir / "imagewoof2-320.tgz.part").write_bytes(b"12345")
    with pytest.raises(DdlError, match="could not download Imagewoof") as info:
        data.download(data_dir, url=url, expected=EXPECTED, timeout=5)
    assert "--synthetic" in str(info.value) and "\n" not in str(info.value)
    assert (data_dir / "imagewoof2-320.tgz.part").read_bytes() == b"12345"


def test_loader_throughput_measures_images_per_second(imagewoof_synthetic):
    from ddl_imagewoof.bench import loader_throughput

    rate = loader_throughput(imagewoof_synthetic, workers=0, n_batches=2, batch_size=8,
                             image_size=64, warmup_batches=1)
    assert 1 < rate < 1e5
