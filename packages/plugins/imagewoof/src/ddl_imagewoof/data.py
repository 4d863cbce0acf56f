"""Imagewoof 320 px on disk, in exactly the layout fastai's archive unpacks to.

    <data_dir>/imagewoof2-320/train/<wnid>/<wnid>_<n>.JPEG        9025 images
    <data_dir>/imagewoof2-320/val/<wnid>/ILSVRC2012_val_<n>.JPEG   3929 images

ten class folders named by ImageNet WordNet ids, read by ``torchvision.datasets.ImageFolder``
(which sorts the folder names, so the label of a class is its index in :data:`WNIDS`).

Two things live here, neither of which imports torch (validation must cost milliseconds):
  * :func:`check_files` - the layout, the class folders, the image counts of the real set, and
    every JPEG's start and end markers, so a bad copy fails with one line naming the file
    instead of a PIL traceback in a DataLoader worker an hour into the job.
  * :func:`download` - the real archive from fastai's S3 bucket, for login nodes.
The learnable generated stand-in (real JPEG files, same folders, marked by SYNTHETIC.txt)
for machines that cannot reach the download server is :mod:`ddl_imagewoof.synthetic`.

Both writers build the new ``imagewoof2-320/`` in a temporary sibling and rename it into place
(:mod:`ddl.contract.datafiles`), so an interrupted run never leaves half a data set behind.
"""

from __future__ import annotations

import os
import tarfile
import time
import zlib
from pathlib import Path

from ddl.contract import datafiles
from ddl.contract.errors import DataError, DataMissing, DdlError

DIRNAME = "imagewoof2-320"
URL = "https://s3.amazonaws.com/fast-ai-imageclas/imagewoof2-320.tgz"  # fastai URLs.IMAGEWOOF_320
ARCHIVE = "imagewoof2-320.tgz"
MARKER = datafiles.MARKER
SPLITS = ("train", "val")

# The ten Imagewoof classes (ImageNet WordNet ids, in ImageFolder's sorted order). Checked
# against public copies of the data set's class lists (fastai imagenette README; the
# Hugging Face image_folder build of imagewoof2-320 lists the same ten folder names).
WNIDS: dict[str, str] = {
    "n02086240": "Shih-Tzu",
    "n02087394": "Rhodesian ridgeback",
    "n02088364": "beagle",
    "n02089973": "English foxhound",
    "n02093754": "Border terrier",
    "n02096294": "Australian terrier",
    "n02099601": "golden retriever",
    "n02105641": "Old English sheepdog",
    "n02111889": "Samoyed",
    "n02115641": "dingo",
}

# Images per split of imagewoof2 (all three sizes hold the same images). No checksum is
# published, so a complete download is recognised by these counts. train: 9025 in the
# dataset_infos of the frgfm/imagewoof copy; train + val = 12954 in a single-split copy of
# imagewoof2-320 (johnowhitaker/imagewoof2-320), hence val = 3929.
EXPECTED_COUNTS = {"train": 9025, "val": 3929}

JPEG_SUFFIXES = (".jpeg", ".jpg")
_EOI_TAIL = 32  # bytes at the end in which the JPEG end-of-image marker must appear

_DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation; a silent firewall would hang otherwise
_CHUNK = 1 << 20


def root(data_dir: Path) -> Path:
    """The ``imagewoof2-320`` directory under ``data_dir``."""
    return Path(data_dir) / DIRNAME


def is_jpeg_name(path: str) -> bool:
    """The files ImageFolder is told to read (and check_files checks): JPEGs only."""
    return path.lower().endswith(JPEG_SUFFIXES)


def is_synthetic(data_dir: Path) -> bool:
    return datafiles.is_synthetic(root(data_dir))


def fix_hint(data_dir: Path) -> str:
    return datafiles.prepare_hint("imagewoof", data_dir)


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def check_jpeg(path: Path) -> str | None:
    """Why ``path`` is not a complete JPEG file, or None.

    Reads 3 bytes at the start and 32 at the end: SOI (FF D8 FF) must open the file and EOI
    (FF D9) must be near its end. A truncated JPEG stops inside entropy-coded data, where a
    literal FF byte is always followed by 00 (or a restart marker), so FF D9 cannot appear
    there; the tail allows for the padding some encoders write after EOI. A full decode
    (PIL's verify) reads every byte and costs far more - see docs/workloads/imagewoof.md.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(3)
            f.seek(max(0, size - _EOI_TAIL))
            tail = f.read()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if head != b"\xff\xd8\xff":
        return "is not a JPEG file (no start-of-image marker)" if size else "is empty"
    if b"\xff\xd9" not in tail:
        return f"is a truncated JPEG ({size} bytes, no end-of-image marker)"
    return None


def _class_files(split_dir: Path) -> dict[str, list[Path]]:
    return {d.name: sorted(p for p in d.iterdir() if p.is_file() and is_jpeg_name(p.name))
            for d in sorted(split_dir.iterdir()) if d.is_dir()}


def check_files(data_dir: Path, *, expected: dict[str, int] | None = None,
                hint_dir: Path | None = None) -> dict[str, int]:
    """Validate ``<data_dir>/imagewoof2-320`` without torch; return the image count per split.

    Raises DataError with one line naming the file or folder and the problem. The real set
    (no SYNTHETIC.txt) must have exactly :data:`EXPECTED_COUNTS` images (or ``expected``),
    which catches an interrupted extraction; a synthetic set only needs images in every class.
    """
    data_dir = Path(data_dir)
    hint = fix_hint(hint_dir or data_dir)
    top = root(data_dir)
    if not top.is_dir():
        raise DataMissing(f"no Imagewoof data in {data_dir} (expected {top}/train and "
                        f"{top}/val); {hint}")
    if expected is None and not is_synthetic(data_dir):
        expected = EXPECTED_COUNTS
    counts = {}
    for split in SPLITS:
        split_dir = top / split
        if not split_dir.is_dir():
            raise DataError(f"missing folder {split_dir} (the Imagewoof data is incomplete); "
                            f"{hint}")
        files = _class_files(split_dir)
        # ImageFolder labels classes by their sorted folder names: a missing or extra
        # folder would silently shift every label.
        missing = [w for w in WNIDS if w not in files]
        if missing:
            raise DataError(f"missing class folder {split_dir / missing[0]} (Imagewoof has "
                            f"the 10 classes {', '.join(WNIDS)}); {hint}")
        extra = [w for w in files if w not in WNIDS]
        if extra:
            raise DataError(f"unexpected folder {split_dir / extra[0]} (Imagewoof has only "
                            f"the 10 classes {', '.join(WNIDS)}; remove it); {hint}")
        for wnid, paths in files.items():
            if not paths:
                raise DataError(f"class folder {split_dir / wnid} holds no .JPEG images; {hint}")
            for path in paths:
                problem = check_jpeg(path)
                if problem:
                    raise DataError(f"corrupt file {path}: it {problem}; {hint}")
        counts[split] = sum(len(p) for p in files.values())
        if expected and counts[split] != expected[split]:
            raise DataError(f"{split_dir} holds {counts[split]} images, expected "
                            f"{expected[split]} (an incomplete copy?); {hint}")
    return counts


# ---------------------------------------------------------------------------------------
# Real download
# ---------------------------------------------------------------------------------------

def _fetch(url: str, part: Path, timeout: float) -> None:
    """Stream ``url`` into ``part``, continuing a partial file with an HTTP Range request.

    Returns when ``part`` holds the whole resource. A server that ignores the Range header
    (status 200) gets the file rewritten from the start; 416 on a non-empty part means
    there is nothing left to fetch.
    """
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "ddl-imagewoof"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = urlopen(Request(url, headers=headers), timeout=timeout)
    except HTTPError as e:
        if e.code == 416 and have:
            return
        raise
    with response:
        if response.status == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {have}-"):
                raise DdlError(f"the server answered a resume request with the wrong range "
                               f"({content_range!r}); delete {part} and run again")
            mode = "ab"
            total = int(content_range.rpartition("/")[2]) if "/" in content_range else None
        else:
            mode, have = "wb", 0
            length = response.headers.get("Content-Length")
            total = int(length) if length else None
        if have:
            print(f"resuming {url} at {have / 1e6:.0f} MB", flush=True)
        written, last_report = have, time.monotonic()
        with open(part, mode) as f:
            while chunk := response.read(_CHUNK):
                f.write(chunk)
                written += len(chunk)
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    of = f" of {total / 1e6:.0f}" if total else ""
                    print(f"  {written / 1e6:.0f}{of} MB", flush=True)
            f.flush()
            os.fsync(f.fileno())
    if total is not None and written != total:
        raise DdlError(f"download of {url} stopped at {written} of {total} bytes; run the "
                       "same command again to resume")


def download(data_dir: Path, *, url: str = URL, expected: dict[str, int] | None = None,
             timeout: float = _DOWNLOAD_TIMEOUT_S) -> Path:
    """Download and unpack the real Imagewoof 320 px; return ``<data_dir>/imagewoof2-320``.

    Safe to re-run: a complete real set is left alone; an interrupted download resumes from
    ``imagewoof2-320.tgz.part`` (HTTP Range). The archive is unpacked with tarfile's
    ``data`` filter (no absolute paths, links out of the tree or device files) into a
    temporary sibling, checked (file counts: no checksum is published) and renamed into
    place, replacing a synthetic set if there is one; then the archive is deleted. Failures
    are one-line DdlErrors.
    """
    data_dir = Path(data_dir)
    expected = expected or EXPECTED_COUNTS
    target = root(data_dir)
    if target.exists() and not is_synthetic(data_dir):
        try:
            counts = check_files(data_dir, expected=expected)
        except DataError:
            pass
        else:
            print(f"Imagewoof already present in {target} ({counts['train']} train, "
                  f"{counts['val']} val images); skipping download")
            return target
    datafiles.make_data_dir(data_dir)
    from http.client import HTTPException

    archive = data_dir / ARCHIVE
    part = data_dir / (ARCHIVE + ".part")
    try:
        if not archive.exists():
            print(f"downloading {url} to {archive}", flush=True)
            _fetch(url, part, timeout)
            os.replace(part, archive)
        _unpack(archive, data_dir, expected)
    except DdlError:
        raise
    except (OSError, HTTPException, ValueError) as e:  # IncompleteRead, a bad Content-Range
        raise datafiles.download_failure(e, data_dir, dataset="Imagewoof", source=url,
                                         plugin="imagewoof") from None
    archive.unlink()
    counts = check_files(data_dir, expected=expected)
    print(f"Imagewoof 320 px: {counts['train']} train and {counts['val']} val images in {target}")
    return target


def _unpack(archive: Path, data_dir: Path, expected: dict[str, int]) -> None:
    with datafiles.scratch_dir(root(data_dir), "unpack") as tmp:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, EOFError, zlib.error) as e:
            archive.unlink()
            raise DdlError(f"the downloaded archive {archive} is damaged "
                           f"({datafiles.short_reason(e)}); "
                           "it was deleted, run the same command again") from None
        try:
            check_files(tmp, expected=expected, hint_dir=data_dir)
        except DataError as e:
            archive.unlink()
            raise DdlError(f"the downloaded archive failed validation: "
                           f"{datafiles.without_hint(e)}; it was deleted, run the same "
                           "command again") from None
        datafiles.install(root(tmp), root(data_dir))

