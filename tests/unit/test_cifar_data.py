"""CIFAR-10 on disk: the synthetic set is the official python format, read by torchvision's
CIFAR10 reader with md5 checks intact; damage gives one line (exit 2) through the real CLI;
the real download fails in one line here (no internet); `ddl plugins` lists the workload."""

import pickle
import shutil

import numpy as np
import pytest

from conftest import assert_one_line_error, run_ddl
from ddl.contract.errors import DataError, DataMissing
from ddl_cifar import data, synthetic

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def synthetic_cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar-data")
    synthetic.write_synthetic(root, train_size=1000, test_size=200, seed=0)
    return root


@pytest.fixture
def cifar_copy(synthetic_cifar, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(synthetic_cifar, target)
    return target


def test_md5_table_is_torchvisions():
    from torchvision.datasets import CIFAR10

    expected = dict(CIFAR10.train_list + CIFAR10.test_list)
    expected[CIFAR10.meta["filename"]] = CIFAR10.meta["md5"]
    assert data.OFFICIAL_MD5 == expected
    assert CIFAR10.base_folder == data.BASE_FOLDER
    assert (CIFAR10.url, CIFAR10.tgz_md5) == (data.TARBALL_URL, data.TARBALL_MD5)


def test_synthetic_set_is_read_by_torchvision(synthetic_cifar):
    from torchvision.datasets import CIFAR10

    from ddl_cifar.dataset import SyntheticCIFAR10, open_split

    train = open_split(synthetic_cifar, train=True)
    test = open_split(synthetic_cifar, train=False)
    assert isinstance(train, SyntheticCIFAR10) and isinstance(train, CIFAR10)
    assert len(train) == 1000 and len(test) == 200
    assert train.data.shape == (1000, 32, 32, 3) and train.data.dtype == np.uint8
    assert train.classes == data.SYNTHETIC_LABEL_NAMES
    image, label = train[0]
    assert image.size == (32, 32) and image.mode == "RGB" and 0 <= label <= 9
    assert np.bincount(train.targets, minlength=10).tolist() == [100] * 10  # balanced


def test_plain_torchvision_rejects_synthetic_md5s(synthetic_cifar):
    """Why the subclass exists: CIFAR10 md5-checks every batch and has no switch for it."""
    from torchvision.datasets import CIFAR10

    with pytest.raises(RuntimeError, match="Dataset not found or corrupted"):
        CIFAR10(str(synthetic_cifar), train=True, download=False)


def test_the_subclass_still_checks_integrity(cifar_copy):
    from ddl_cifar.dataset import open_split

    path = data.cifar_dir(cifar_copy) / "data_batch_2"
    blob = bytearray(path.read_bytes())
    blob[-100] ^= 0xFF  # one pixel value
    path.write_bytes(bytes(blob))
    with pytest.raises(RuntimeError, match="Dataset not found or corrupted"):
        open_split(cifar_copy, train=True)


def test_files_are_python2_pickles_like_the_official_ones(synthetic_cifar):
    """torchvision unpickles with encoding='latin1' (str keys), the CIFAR page's snippet with
    encoding='bytes' (b'data'); both must work, as with the official files."""
    path = data.cifar_dir(synthetic_cifar) / "data_batch_1"
    assert path.read_bytes()[:3] == b"\x80\x02}"  # protocol 2, a dict
    with open(path, "rb") as f:
        as_bytes = pickle.load(f, encoding="bytes")
    with open(path, "rb") as f:
        as_latin1 = pickle.load(f, encoding="latin1")
    assert set(as_bytes) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert set(as_latin1) == {"batch_label", "labels", "data", "filenames"}
    rows = as_bytes[b"data"]
    assert rows.shape == (200, 3072) and rows.dtype == np.uint8
    np.testing.assert_array_equal(rows, as_latin1["data"])
    # rows are R, G, B planes of 32x32: torchvision's reshape gives HWC images
    from ddl_cifar.dataset import open_split

    train = open_split(synthetic_cifar, train=True)
    np.testing.assert_array_equal(rows[7].reshape(3, 32, 32).transpose(1, 2, 0), train.data[7])
    assert as_bytes[b"labels"] == train.targets[:200]
    with open(data.cifar_dir(synthetic_cifar) / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="bytes")
    assert meta[b"num_vis"] == 3072 and len(meta[b"label_names"]) == 10


def test_mean_colour_does_not_give_the_class(synthetic_cifar):
    """Colours are random and independent of the class: a nearest-class-mean classifier on
    an image's mean colour stays near chance (10 %), while the shapes carry the class (the
    tiny ResNet reaches well above 35 %, tests/distributed/test_cifar_train.py)."""
    from ddl_cifar.dataset import open_split

    train = open_split(synthetic_cifar, train=True)
    test = open_split(synthetic_cifar, train=False)
    features = train.data.reshape(len(train), -1, 3).mean(axis=1)
    labels = np.array(train.targets)
    centroids = np.stack([features[labels == c].mean(axis=0) for c in range(10)])
    test_features = test.data.reshape(len(test), -1, 3).mean(axis=1)
    predicted = np.argmin(((test_features[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (predicted == np.array(test.targets)).mean() < 0.2


def test_check_files(cifar_copy, tmp_path):
    data.check_files(cifar_copy)
    with pytest.raises(DataMissing, match="no CIFAR-10 data"):
        data.check_files(tmp_path)
    (data.cifar_dir(cifar_copy) / data.MARKER).unlink()  # now held to the official md5s
    with pytest.raises(DataError, match="data_batch_1: md5 .* differs from the official md5"):
        data.check_files(cifar_copy)


def test_synthetic_writer_refuses_real_data_and_leaves_no_temporaries(tmp_path):
    base = data.cifar_dir(tmp_path)
    base.mkdir()
    (base / "data_batch_1").write_bytes(b"real data, say")
    with pytest.raises(DataError, match="refusing to overwrite"):
        synthetic.write_synthetic(tmp_path, train_size=10, test_size=10)
    shutil.rmtree(base)
    synthetic.write_synthetic(tmp_path, train_size=10, test_size=10, seed=1)
    first = (base / "test_batch").read_bytes()
    synthetic.write_synthetic(tmp_path, train_size=10, test_size=10, seed=1)  # replaces, same bytes
    assert (base / "test_batch").read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [data.BASE_FOLDER]


# --- issue 52: a data file that would run code, an md5 list that is not text -------------


class _CreatesFile:
    """Unpickled by a plain pickle.load, this opens (creates) ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(cifar_root, name, blob):
    """Replace batch ``name`` and put its md5 into synthetic.md5, as an attacker who can
    write the data directory can."""
    import hashlib

    base = data.cifar_dir(cifar_root)
    (base / name).write_bytes(blob)
    lines = [f"{hashlib.md5(blob).hexdigest()}  {name}" if line.endswith(f"  {name}") else line
             for line in (base / data.MANIFEST).read_text().splitlines()]
    (base / data.MANIFEST).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("name, train", [("data_batch_2", True), ("test_batch", False),
                                         ("batches.meta", False)])
def test_a_batch_whose_pickle_would_create_a_file_creates_none(cifar_copy, tmp_path, name,
                                                                train):
    from ddl_cifar.dataset import open_split

    made = tmp_path / "created-by-the-data"
    _plant(cifar_copy, name, pickle.dumps({"data": _CreatesFile(made), "labels": []},
                                          protocol=2))
    data.check_files(cifar_copy)  # the md5s match: only the reader can stop it
    with pytest.raises(DataError) as caught:
        open_split(cifar_copy, train=train)
    assert not made.exists()
    message = str(caught.value)
    assert "\n" not in message and f"corrupt file {data.cifar_dir(cifar_copy) / name}" in message
    assert "its pickle asks for io.open" in message and "nothing was run" in message
    assert "allowed: dict, list, str, bytes, int and numpy arrays" in message


def test_a_batch_of_the_wrong_shape_is_one_line(cifar_copy):
    from ddl_cifar.dataset import open_split

    _plant(cifar_copy, "data_batch_1", pickle.dumps(
        {"data": np.zeros((2, 5), np.uint8), "labels": [0, 1]}, protocol=2))
    with pytest.raises(DataError, match="data_batch_1: 'data' is not a uint8 array of 3072"):
        open_split(cifar_copy, train=True)


def test_real_layout_batches_read_as_torchvision_reads_them(synthetic_cifar):
    """The allow-listing reader gives what torchvision's plain pickle.load gives."""
    from torchvision.datasets import CIFAR10

    from ddl_cifar.dataset import open_split

    sums = data.read_manifest(synthetic_cifar)

    class Plain(CIFAR10):  # torchvision's own reading, the set's md5s
        train_list = [[name, sums[name]] for name in data.TRAIN_FILES]
        test_list = [[data.TEST_FILE, sums[data.TEST_FILE]]]
        meta = {**CIFAR10.meta, "md5": sums[data.META_FILE]}

    ours, plain = open_split(synthetic_cifar, train=True), Plain(str(synthetic_cifar))
    np.testing.assert_array_equal(ours.data, plain.data)
    assert ours.targets == plain.targets and ours.classes == plain.classes


def test_a_non_utf8_byte_in_the_md5_list_is_one_line(cifar_copy):
    path = data.cifar_dir(cifar_copy) / data.MANIFEST
    path.write_bytes(path.read_bytes().replace(b"  data_batch_1", b"  data_batch_\xff1"))
    with pytest.raises(DataError) as caught:
        data.check_files(cifar_copy)
    assert f"corrupt file {path}: byte 0xff" in str(caught.value)
    assert "\n" not in str(caught.value) and "ddl prepare --plugin cifar" in str(caught.value)


# --- through the real CLI ----------------------------------------------------------------


def _flip_byte(path, where):
    blob = bytearray(path.read_bytes())
    blob[where] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupt_files_give_one_line(cifar_copy, tmp_path, damage):
    base = data.cifar_dir(cifar_copy)
    if damage == "flip":
        path = base / "data_batch_3"
        _flip_byte(path, 5000)
    elif damage == "truncate":
        path = base / "test_batch"
        path.write_bytes(path.read_bytes()[:1000])
    else:
        path = base / "batches.meta"
        path.unlink()
    proc = run_ddl("train", "--plugin", "cifar", "--preset", "tiny", "--data-dir",
                   str(cifar_copy), cwd=tmp_path)
    line = assert_one_line_error(proc, path.name, "ddl prepare --plugin cifar")
    assert ("missing file" if damage == "delete" else "corrupt file") in line
    assert not (tmp_path / "runs").exists()


def test_missing_data_names_the_prepare_command(tmp_path):
    proc = run_ddl("train", "--plugin", "cifar", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(proc, "no CIFAR-10 data", "ddl prepare --plugin cifar")


def test_real_download_fails_in_one_line_offline(tmp_path):
    """This machine cannot reach www.cs.toronto.edu; the real download code must say so."""
    target = tmp_path / "d"
    proc = run_ddl("prepare", "--plugin", "cifar", "--data-dir", str(target), timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "could not download CIFAR-10" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not data.cifar_dir(target).exists()
    assert not (target / ".cifar-10-download").exists()  # nothing half-done left behind


def test_plugins_lists_cifar_with_its_presets():
    proc = run_ddl("plugins")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.split()[:1] == ["cifar"])
    assert "ResNet50 v2" in lines[i]
    assert "presets: course (default), resnet152, throughput, tiny, tiny-ghostbn; " \
        "from ddl-cifar " in lines[i + 1]
    support = next(line for line in lines[i + 2:] if line.split()[:1] == ["cifar"])
    assert support.split()[1] == "yes"  # ddp, the first strategy column
