"""XSum and T5 on disk: the layout every Hugging Face loader reads offline.

Compute nodes have no internet, so `ddl prepare` (on a login node) puts everything a run
needs under ``<data_dir>/xsum``, in the libraries' own formats::

    xsum/dataset/               datasets.DatasetDict.save_to_disk: train/validation/test
                                (columns document, summary, id), read by load_from_disk
    xsum/models/t5-base/        T5 weights + config + tokenizer (save_pretrained), read by
    xsum/models/t5-small/         from_pretrained(local_dir) with the HF offline variables set
    xsum/models/t5-tiny/        config.json only: a small T5 trained from scratch (tiny preset)

A synthetic set (``prepare --synthetic``) has the same dataset layout and instead::

    xsum/models/synthetic-tokenizer/     a BPE tokenizer trained here with `tokenizers`
    xsum/models/synthetic-t5-*/          config.json only (no pretrained weights exist
                                         offline: the model is initialised from the config)
    xsum/SYNTHETIC.txt                   the marker behind is_synthetic()

Two things live here, as in the MNIST plugin:
  * `check` validates the files cheaply (JSON parses, Arrow streams read to the end,
    safetensors sizes match their headers), so a job fails in a second with one line
    instead of deep inside a loader on every rank;
  * `download` fetches the real data and models from the Hugging Face Hub.
The learnable stand-in is generated and written by :mod:`ddl_xsum.synthetic`.

Every writer builds a complete new tree in a temporary sibling and renames it into place
(:mod:`ddl.contract.datafiles`), so an interrupted run never leaves half a data set behind. Only the
standard library is imported at module level (pyarrow, datasets, tokenizers and transformers
cost seconds).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from ddl.contract import datafiles
from ddl.contract.errors import DataError, DataMissing, DdlError

XSUM = "xsum"
MARKER = datafiles.MARKER
#: The course's split sizes. Real data: the first N articles of each official split
#: (XSum's splits are already random; Narayan et al. 2018, sec. 4), i.e. "train[:1500]".
SPLIT_SIZES = {"train": 1500, "validation": 300, "test": 300}
COLUMNS = ("document", "summary", "id")  # XSum's schema

HUB_DATASET = "EdinburghNLP/xsum"  # the course's "xsum", moved under its authors' org
HUB_MODELS = {"t5-base": "google-t5/t5-base", "t5-small": "google-t5/t5-small"}
#: Bigger models, fetched only for a preset that names them (``ddl prepare --plugin xsum
#: --preset t5-large``: 3 GB; t5-3b: 11 GB); without their weights a run initialises them
#: randomly from :data:`T5_SHAPES` and says so in one line.
LARGE_HUB_MODELS = {"t5-large": "google-t5/t5-large", "t5-3b": "google-t5/t5-3b"}
SYNTHETIC_TOKENIZER = "synthetic-tokenizer"

#: Architecture of each model name, for models built from a config (Raffel et al. 2020,
#: table 14: T5-Small and T5-Base). t5-tiny is ours: small enough for CPU tests.
T5_SHAPES: dict[str, dict] = {
    "t5-small": {"d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8, "num_layers": 6},
    "t5-base": {"d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12, "num_layers": 12},
    "t5-large": {"d_model": 1024, "d_ff": 4096, "d_kv": 64, "num_heads": 16, "num_layers": 24},
    "t5-3b": {"d_model": 1024, "d_ff": 16384, "d_kv": 128, "num_heads": 32, "num_layers": 24},
    # No dropout: a small model trained for a few epochs does not need it, and without it a
    # run on N processes reproduces the single-process run exactly.
    "t5-tiny": {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2,
                "dropout_rate": 0.0},
}
#: The environment variables that keep Hugging Face libraries off the network.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
                "HF_EVALUATE_OFFLINE")
_PROBE_TIMEOUT_S = 10.0


def xsum_dir(data_dir: Path) -> Path:
    return Path(data_dir) / XSUM


def dataset_dir(data_dir: Path) -> Path:
    return xsum_dir(data_dir) / "dataset"


def is_synthetic(data_dir: Path) -> bool:
    return datafiles.is_synthetic(xsum_dir(data_dir))


def model_dir(data_dir: Path, model: str, synthetic: bool) -> Path:
    return xsum_dir(data_dir) / "models" / (f"synthetic-{model}" if synthetic else model)


def tokenizer_dir(data_dir: Path, tokenizer: str, synthetic: bool) -> Path:
    name = SYNTHETIC_TOKENIZER if synthetic else tokenizer
    return xsum_dir(data_dir) / "models" / name


def t5_config(model: str, vocab_size: int):
    """A ``transformers.T5Config`` for one of :data:`T5_SHAPES` (T5 v1 defaults: ReLU
    feed-forward, tied embeddings, pad 0 = decoder start, eos 1)."""
    from transformers import T5Config

    return T5Config(vocab_size=vocab_size, feed_forward_proj="relu", tie_word_embeddings=True,
                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                    **T5_SHAPES[model])


def _fix_hint(data_dir: Path) -> str:
    return datafiles.prepare_hint("xsum", data_dir)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _corrupt(path: Path, what: str, data_dir: Path) -> DataError:
    return DataError(f"corrupt file {path}: {what}; {_fix_hint(data_dir)}")


def _read_json(path: Path, data_dir: Path):
    if not path.is_file():
        raise DataError(f"missing file {path} (the xsum data is incomplete); "
                        f"{_fix_hint(data_dir)}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _corrupt(path, f"not valid JSON ({first})", data_dir) from None


def _check_arrow(path: Path, data_dir: Path) -> int:
    """Read a datasets Arrow file (IPC stream format) to its end; return its row count."""
    import pyarrow as pa

    if not path.is_file():
        raise DataError(f"missing file {path} (the xsum data is incomplete); "
                        f"{_fix_hint(data_dir)}")
    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _corrupt(path, f"unreadable Arrow stream ({first}; truncated?)", data_dir) from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise _corrupt(path, f"no column {missing[0]!r} (XSum has {', '.join(COLUMNS)})",
                       data_dir)
    return table.num_rows


def check_dataset(data_dir: Path) -> dict[str, int]:
    """Validate the saved DatasetDict; return rows per split."""
    root = dataset_dir(data_dir)
    splits = _read_json(root / "dataset_dict.json", data_dir).get("splits", [])
    rows = {}
    for split in SPLIT_SIZES:
        if split not in splits:
            raise _corrupt(root / "dataset_dict.json", f"no split {split!r} (has "
                           f"{', '.join(map(str, splits)) or 'none'})", data_dir)
        state = _read_json(root / split / "state.json", data_dir)
        _read_json(root / split / "dataset_info.json", data_dir)
        files = [f.get("filename") for f in state.get("_data_files", [])]
        if not files or not all(isinstance(f, str) for f in files):
            raise _corrupt(root / split / "state.json", "lists no data files", data_dir)
        rows[split] = sum(_check_arrow(root / split / f, data_dir) for f in files)
        if rows[split] == 0:
            raise _corrupt(root / split / files[0], f"the {split} split is empty", data_dir)
    return rows


def _check_safetensors(path: Path, data_dir: Path) -> None:
    """Header and size only: a truncated copy is the common failure, and reading 900 MB of
    weights to find it would cost more than the check is worth."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > size - 8:
                raise _corrupt(path, f"{size} bytes cannot hold a {n}-byte safetensors header",
                               data_dir)
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path, f"unreadable safetensors header ({exc})", data_dir) from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
              default=0)
    if size != 8 + n + end:
        raise _corrupt(path, f"{size} bytes, but its header says {8 + n + end}"
                       + (" (truncated?)" if size < 8 + n + end else ""), data_dir)


def check_model_dir(path: Path, data_dir: Path, *, weights: bool) -> None:
    if not path.is_dir():
        raise DataError(f"missing model directory {path} (the xsum data is incomplete); "
                        f"{_fix_hint(data_dir)}")
    _read_json(path / "config.json", data_dir)
    if not weights:
        return
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index, data_dir).get("weight_map", {}).values()))
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        if not (path / shard).is_file():
            raise DataError(f"missing file {path / shard} (the model weights are incomplete); "
                            f"{_fix_hint(data_dir)}")
        _check_safetensors(path / shard, data_dir)


def check_tokenizer_dir(path: Path, data_dir: Path) -> None:
    if not path.is_dir():
        raise DataError(f"missing tokenizer directory {path} (the xsum data is incomplete); "
                        f"{_fix_hint(data_dir)}")
    _read_json(path / "tokenizer.json", data_dir)
    if (path / "tokenizer_config.json").exists():
        _read_json(path / "tokenizer_config.json", data_dir)


def check(data_dir: Path, *, model: str, tokenizer: str) -> None:
    """Everything a run of ``model`` with ``tokenizer`` reads: DataMissing if there is no
    xsum data at all, DataError (one line, naming the file) if any of it is unusable."""
    data_dir = Path(data_dir)
    root = xsum_dir(data_dir)
    if not dataset_dir(data_dir).exists():
        raise DataMissing(f"no xsum data in {data_dir} (expected {root}/dataset); "
                          f"{_fix_hint(data_dir)}")
    synthetic = is_synthetic(data_dir)
    check_dataset(data_dir)
    check_tokenizer_dir(tokenizer_dir(data_dir, tokenizer, synthetic), data_dir)
    if not synthetic and model in LARGE_HUB_MODELS and not model_dir(data_dir, model,
                                                                     False).exists():
        return  # not fetched: random initialisation (the workload says so)
    check_model_dir(model_dir(data_dir, model, synthetic), data_dir,
                    weights=not synthetic and model in {**HUB_MODELS, **LARGE_HUB_MODELS})


# ---------------------------------------------------------------------------
# Library settings
# ---------------------------------------------------------------------------


def quiet_hf() -> None:
    """No progress bars or advisory warnings from the HF libraries in ddl's output."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------------------
# Real download (login nodes)
# ---------------------------------------------------------------------------


_HUB = {"dataset": "XSum/T5", "source": "the Hugging Face Hub", "plugin": "xsum"}


def _no_hub(reason: str, data_dir: Path) -> DdlError:
    return datafiles.unreachable(reason=reason, data_dir=data_dir, **_HUB)


def _probe_hub(data_dir: Path) -> None:
    """Fail in seconds, not minutes: huggingface_hub retries every request five times with
    back-off (~25 s per file when the host does not resolve, longer when packets are
    dropped), so one direct TCP connection decides first whether the Hub is reachable."""
    on = [v for v in OFFLINE_VARS if os.environ.get(v, "").strip().lower()
          in ("1", "true", "yes", "on")]
    if on:
        raise _no_hub(f"{on[0]}={os.environ[on[0]]} is set; unset it for the download",
                      data_dir)
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # only the proxy knows; let the libraries try through it
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parts = urlsplit(endpoint)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((parts.hostname, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise _no_hub(f"cannot reach {parts.hostname}:{port}: {reason}", data_dir) from None


def _load_xsum(cache: Path):
    """The course's slices of XSum as a DatasetDict (first N articles of each split)."""
    import datasets

    slices = [f"{split}[:{n}]" for split, n in SPLIT_SIZES.items()]
    try:
        parts = datasets.load_dataset(HUB_DATASET, split=slices, cache_dir=str(cache))
    except RuntimeError as exc:
        # datasets >= 4 no longer runs loading scripts; XSum's repository was script-based,
        # and the Hub serves every such dataset converted to Parquet on this branch.
        if "scripts are no longer supported" not in str(exc):
            raise
        parts = datasets.load_dataset(HUB_DATASET, split=slices, cache_dir=str(cache),
                                      revision="refs/convert/parquet")
    ddict = datasets.DatasetDict(dict(zip(SPLIT_SIZES, parts)))
    for split, n in SPLIT_SIZES.items():
        if ddict[split].num_rows != n or not set(COLUMNS) <= set(ddict[split].column_names):
            raise DdlError(f"{HUB_DATASET} {split} split has {ddict[split].num_rows} rows and "
                           f"columns {ddict[split].column_names}; expected {n} rows with "
                           f"{', '.join(COLUMNS)}")
    return ddict.select_columns(list(COLUMNS))


def _short(exc: BaseException) -> str:
    """The exception's type and first line: HF libraries raise many types for one failure,
    and the type often says more than the text."""
    text = datafiles.first_line(str(exc), limit=200)
    return datafiles.first_line(f"{type(exc).__name__}: {text}", limit=200) if text \
        else type(exc).__name__


def download(data_dir: Path, extra_models: tuple[str, ...] = ()) -> Path:
    """Fetch the course's XSum slices and the T5 models into ``<data_dir>/xsum``.

    Safe to re-run: parts of a real set that validate are kept. A synthetic set is replaced
    as a whole, and only once everything downloaded. Integrity: the Hub client checks each
    file against the repository's content hash; the saved files are then validated by
    :func:`check`. Network failures become a single-line DdlError.
    """
    data_dir = Path(data_dir)
    target = xsum_dir(data_dir)
    _probe_hub(data_dir)
    datafiles.make_data_dir(data_dir)
    quiet_hf()
    try:
        with datafiles.scratch_dir(target, "download") as staging:
            _download_into(staging, data_dir, extra_models)
        check(data_dir, model="t5-base", tokenizer="t5-base")
    except DdlError:
        raise
    except Exception as exc:  # HF libraries raise many types for one failed request
        raise datafiles.download_failure(exc, data_dir, reason=_short, **_HUB) from None
    return target


def _download_into(staging: Path, data_dir: Path, extra_models: tuple[str, ...] = ()) -> None:
    """Download what is missing into ``staging``, then install it under ``<data_dir>/xsum``."""
    target = xsum_dir(data_dir)
    new = staging / XSUM
    cache = staging / "hf-cache"  # not ~/.cache: $HOME is small on HPC systems
    real = target.exists() and not is_synthetic(data_dir)

    def complete(check_fn) -> bool:
        if not real:
            return False
        try:
            check_fn()
        except DataError:
            return False
        return True

    parts: list[Path] = []  # relative paths downloaded into `new`
    if not complete(lambda: check_dataset(data_dir)):
        print(f"xsum: downloading {HUB_DATASET} ({', '.join(f'{s} {n}' for s, n in SPLIT_SIZES.items())})",
              flush=True)
        _load_xsum(cache).save_to_disk(str(new / "dataset"))
        parts.append(Path("dataset"))
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    vocab = None
    wanted = {**HUB_MODELS, **{m: LARGE_HUB_MODELS[m] for m in extra_models}}
    for name, repo in wanted.items():
        where = model_dir(data_dir, name, False)
        if complete(lambda w=where: (check_model_dir(w, data_dir, weights=True),
                                     check_tokenizer_dir(w, data_dir))):
            continue
        print(f"xsum: downloading {repo}", flush=True)
        out = new / "models" / name
        tokenizer = AutoTokenizer.from_pretrained(repo, cache_dir=str(cache))
        tokenizer.save_pretrained(str(out))
        vocab = vocab or len(tokenizer)
        model = T5ForConditionalGeneration.from_pretrained(repo, cache_dir=str(cache))
        model.save_pretrained(str(out))
        del model
        parts.append(Path("models") / name)
    if not complete(lambda: check_model_dir(model_dir(data_dir, "t5-tiny", False), data_dir,
                                            weights=False)):
        if vocab is None:
            vocab = len(AutoTokenizer.from_pretrained(str(target / "models" / "t5-base")))
        t5_config("t5-tiny", vocab).save_pretrained(str(new / "models" / "t5-tiny"))
        parts.append(Path("models") / "t5-tiny")

    if real:  # complete the real set part by part
        for part in parts:
            (target / part).parent.mkdir(parents=True, exist_ok=True)
            datafiles.install(new / part, target / part)
    else:  # nothing, or a synthetic set: replace it as a whole
        datafiles.install(new, target)
