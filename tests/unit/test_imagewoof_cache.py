"""The Imagewoof decode cache and the crops made on the device from it: the cache holds what
decoding the JPEG gives at that size, a sample's augmentation depends on (seed, epoch,
index) and not on the rank or loader process reading it, changed files and damaged caches
are rebuilt, and racing builders decode once. All on the synthetic JPEGs the project
generates in the real folder layout; crops run on the CPU (the same torch ops a GPU runs)."""

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ddl.worker.train.loaders import train_loader
from ddl_imagewoof import cached_folder, crops, decode_cache, synthetic
from ddl_imagewoof.plugin import PRESETS
from ddl_imagewoof.workload import ImagewoofWorkload

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def small_set(tmp_path_factory) -> Path:
    """6 train and 2 val images per class: enough for every check, cheap to decode."""
    root = tmp_path_factory.mktemp("iw-cache") / "data"
    synthetic.write_synthetic(root, 6, 2, seed=1)
    return root


@pytest.fixture
def data_dir(small_set, tmp_path) -> Path:
    target = tmp_path / "data"
    shutil.copytree(small_set, target)  # copy2 keeps mtimes: a built cache stays valid
    return target


def workload(preset: str = "tiny", **options) -> ImagewoofWorkload:
    base = PRESETS[preset]
    return ImagewoofWorkload(base.__class__(**{**base.__dict__,
                                               "options": {**base.options, **options}}))


def cache_dirs(data_dir: Path, split: str = "train") -> list[Path]:
    return sorted((data_dir / cached_folder.CACHE_DIRNAME).glob(f"{split}-*"))


def canvases(splits) -> np.ndarray:
    return np.load(splits["train"].dataset.path / "images.npy")


# --- the cache's content ------------------------------------------------------------------


def test_cache_holds_each_jpeg_decoded_at_the_canvas_size(data_dir):
    from PIL import Image
    from torchvision.transforms import v2

    w = workload()
    splits = w.datasets(data_dir)
    images = splits["train"].dataset
    size = cached_folder.canvas_size(w.image_size)
    assert size == 96 and len(cache_dirs(data_dir)) == len(cache_dirs(data_dir, "val")) == 1
    stored = canvases(splits)
    assert stored.shape == (60, size, size, 3) and stored.dtype == np.uint8
    files = sorted((data_dir / "imagewoof2-320" / "train").glob("*/*.JPEG"))
    classes = sorted({f.parent.name for f in files})
    assert images.targets == [classes.index(f.parent.name) for f in files]
    for i in (0, 17, 59):  # a full-size decode and torch's resize: the same picture
        with Image.open(files[i]) as im:
            decoded = v2.functional.pil_to_tensor(im.convert("RGB"))
        assert tuple(images.dims[i]) == tuple(decoded.shape[1:])  # original (height, width)
        direct = v2.Resize((size, size), antialias=True)(decoded).permute(1, 2, 0).float()
        diff = (torch.from_numpy(stored[i]).float() - direct).abs()
        assert diff.mean() < 4, (i, diff.mean())
        other = torch.from_numpy(stored[(i + 7) % 60]).float()  # a different image is far off
        assert (other - direct).abs().mean() > 4 * diff.mean()


def test_eval_crops_match_the_jpeg_path(data_dir):
    """Resize + CenterCrop from the JPEG and the centre box cropped on the device from the
    cache agree within resampling noise, and a one-pixel shift is clearly worse (so the
    geometry, not only the colours, is the same)."""
    from torch.utils.data import default_collate

    cached, jpeg = workload("course"), workload("course", decode_cache=False)
    a, b = cached.datasets(data_dir)["test"], jpeg.datasets(data_dir)["test"]
    x, _ = cached.to_device(default_collate([a[i] for i in range(8)]), CPU)
    y, _ = jpeg.to_device(default_collate([b[i] for i in range(8)]), CPU)
    assert x.shape == y.shape == (8, 3, 160, 160)

    def off(shift: int) -> float:
        inner = (slice(None), slice(None), slice(2, -2), slice(2, -2))
        return (x[inner] - torch.roll(y, shift, 3)[inner]).abs().mean().item()

    assert off(0) < 0.08 and off(1) > 2 * off(0) and off(-1) > 2 * off(0)


# --- augmentation: the same sample, the same crop, whoever reads it --------------------


def augmented(w: ImagewoofWorkload, train, replicas: int, rank: int, epoch: int,
              workers: int = 0) -> dict[int, torch.Tensor]:
    """What each sample of this rank's shard looks like to the model in ``epoch``."""
    loader = train_loader(train, batch_size=4, replicas=replicas, rank=rank, seed=7,
                          workers=workers, pin_memory=False)
    loader.sampler.set_epoch(epoch)
    order = list(loader.sampler)
    seen = {}
    for k, batch in enumerate(loader):
        inputs, _ = w.to_device(batch, CPU)
        for j, x in enumerate(inputs):
            seen[order[4 * k + j]] = x
    return seen


def test_augmentation_is_the_same_on_one_rank_and_on_two(data_dir):
    w = workload()
    train = w.datasets(data_dir)["train"]
    one = augmented(w, train, 1, 0, epoch=1)
    two = {**augmented(w, train, 2, 0, epoch=1), **augmented(w, train, 2, 1, epoch=1)}
    assert len(two) == 48 and set(two) <= set(one)  # 2 x 6 batches of 4 out of 54
    for index, x in two.items():
        assert torch.equal(x, one[index]), index
    again = augmented(w, train, 1, 0, epoch=2)  # a new epoch, new crops
    assert sum(not torch.equal(again[i], one[i]) for i in one if i in again) > 40
    with_worker = augmented(w, train, 2, 1, epoch=1, workers=1)  # a loader process
    assert all(torch.equal(x, two[i]) for i, x in with_worker.items())


def test_random_crops_follow_random_resized_crop():
    rng = np.random.default_rng(0)
    for height, width in [(320, 426), (480, 320), (320, 1200)]:
        for _ in range(300):
            top, left, h, w = crops.random_resized_crop(rng, height, width)
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
            assert h * w <= height * width
            if (h, w) != (height, width) and h * w >= 0.08 * height * width * 0.95:
                assert 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02
    box = crops.sample_box(3, (320, 480), 96, train=False, seed=0, epoch=0)
    assert np.allclose(box, [16, 0, 80, 96, 0])  # the centred 320 x 320 square, no flip
    flips = [crops.sample_box(i, (320, 480), 96, train=True, seed=0, epoch=0)[4]
             for i in range(400)]
    assert 150 < sum(flips) < 250


# --- rebuilding and racing --------------------------------------------------------------


def test_changed_files_give_a_new_cache_and_the_old_one_goes(data_dir):
    w = workload()
    first = canvases(w.datasets(data_dir))
    old = cache_dirs(data_dir)
    files = sorted((data_dir / "imagewoof2-320" / "train").glob("*/*.JPEG"))
    shutil.copyfile(files[30], files[0])  # image 0 now shows what image 30 shows
    second = canvases(w.datasets(data_dir))
    assert cache_dirs(data_dir) != old and len(cache_dirs(data_dir)) == 1
    assert np.array_equal(second[0], first[30]) and np.array_equal(second[1:], first[1:])


@pytest.mark.parametrize("damage", ["truncated", "meta", "shape"])
def test_a_damaged_cache_is_rebuilt_not_trusted(data_dir, damage):
    w = workload()
    good = canvases(w.datasets(data_dir))
    (built,) = cache_dirs(data_dir)
    images = built / "images.npy"
    if damage == "truncated":  # e.g. a full disk while another tool copied it
        images.write_bytes(images.read_bytes()[: images.stat().st_size // 2])
    elif damage == "meta":
        (built / "meta.json").write_text("{")
    else:  # a well-formed array of the wrong shape
        np.save(images, np.zeros((3, 96, 96, 3), np.uint8))
    assert np.array_equal(canvases(w.datasets(data_dir)), good)
    assert cache_dirs(data_dir) == [built]


def test_leftovers_of_a_killed_build_are_ignored_and_removed(data_dir):
    where = data_dir / cached_folder.CACHE_DIRNAME
    partial = where / ".train-96px-0123.99999.tmp"  # what a build killed half-way leaves
    partial.mkdir(parents=True)
    (partial / "images.npy").write_bytes(b"\x93NUMPY")
    workload().datasets(data_dir)
    assert not partial.exists() and len(cache_dirs(data_dir)) == 1


def test_racing_builders_decode_once(data_dir, monkeypatch):
    """Two ranks opening the cache at once: one builds, the other waits on the lock and
    reads what it wrote (threads hold separate flocks just as processes do)."""
    builds = []
    real_build = decode_cache._build

    def counted(*args):
        builds.append(args[0])
        real_build(*args)

    monkeypatch.setattr(decode_cache, "_build", counted)
    folder_split = workload().datasets  # the workload scans the folders once per call
    results, errors = [], []

    def rank():
        try:
            results.append(folder_split(data_dir)["train"].dataset.path)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert len(builds) == 2  # one for train, one for val: not one per rank
    assert not list((data_dir / cached_folder.CACHE_DIRNAME).glob(".*.tmp"))


# --- switching it off -----------------------------------------------------------------


def test_off_or_unwritable_reads_the_jpegs(data_dir, tmp_path, monkeypatch, capsys):
    from torch.utils.data import Subset

    monkeypatch.setenv(cached_folder.CACHE_ENV, "off")
    splits = workload().datasets(data_dir)
    assert type(splits["train"]) is Subset and splits["train"][0][0].shape == (3, 64, 64)
    assert not (data_dir / cached_folder.CACHE_DIRNAME).exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cached_folder.CACHE_ENV, str(blocker / "cache"))  # cannot be made
    splits = workload().datasets(data_dir)
    assert type(splits["train"]) is Subset
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decode cache" in err[0] and cached_folder.CACHE_ENV in err[0]
    elsewhere = tmp_path / "cache"
    monkeypatch.setenv(cached_folder.CACHE_ENV, str(elsewhere))
    assert workload().datasets(data_dir)["train"].dataset.path.parent == elsewhere
