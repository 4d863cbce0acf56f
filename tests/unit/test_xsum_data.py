"""XSum on disk: the synthetic set is read by the real Hugging Face loaders, damage is one
clear line through the real CLI, and the real download fails fast and cleanly offline."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import assert_one_line_error, run_ddl
from ddl.contract.errors import DataError, DataMissing
from ddl_xsum import data, synthetic

pytestmark = pytest.mark.unit

SIZES = {"train": 96, "validation": 24, "test": 24}


@pytest.fixture(scope="module")
def xsum_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("xsum-data")
    synthetic.write_synthetic(root, sizes=SIZES, seed=0)
    return root


@pytest.fixture
def xsum_copy(xsum_data, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(xsum_data, target)
    return target


def test_synthetic_set_is_read_by_the_official_loaders(xsum_data):
    import datasets
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    assert data.is_synthetic(xsum_data)
    ddict = datasets.load_from_disk(str(data.dataset_dir(xsum_data)))
    assert {s: ddict[s].num_rows for s in ddict} == SIZES
    assert ddict["train"].column_names == ["document", "summary", "id"]
    assert all(isinstance(v, str) for v in ddict["test"][0].values())

    tok = AutoTokenizer.from_pretrained(str(data.tokenizer_dir(xsum_data, "t5-base", True)),
                                        local_files_only=True)
    # T5's conventions: <pad>=0 (also the decoder start), </s>=1 appended, <unk>=2
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    summary = ddict["train"][0]["summary"]
    ids = tok(summary)["input_ids"]
    assert ids[-1] == 1 and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == summary

    config = T5Config.from_pretrained(str(data.model_dir(xsum_data, "t5-tiny", True)))
    assert (config.d_model, config.num_layers, config.num_heads, config.d_ff) == (64, 2, 4, 128)
    assert config.vocab_size == len(tok) and config.decoder_start_token_id == 0
    base = T5Config.from_pretrained(str(data.model_dir(xsum_data, "t5-base", True)))
    assert (base.d_model, base.num_layers, base.num_heads, base.d_ff) == (768, 12, 12, 3072)
    assert T5ForConditionalGeneration(config).config.vocab_size == len(tok)
    data.check(xsum_data, model="t5-base", tokenizer="t5-base")  # every preset's files
    data.check(xsum_data, model="t5-tiny", tokenizer="t5-base")


def test_summary_is_a_function_of_the_documents_facts():
    """Learnable: the salient facts of the summary are all stated in the document, and the
    same facts always give the same summary."""
    for record in synthetic.articles(200, seed=3):
        doc, summary = record["document"], record["summary"]
        actor = next(a for a in synthetic.ACTORS if summary.lower().startswith(a.lower()))
        words = summary.rstrip(".").split()
        number, place = words[-4], words[-1]
        assert actor in doc or actor[0].upper() + actor[1:] in doc
        event = [s for s in doc.splitlines() if f" {number} {words[-3]} " in f" {s} "]
        assert len(event) == 1 and place in event[0], (doc, summary)
        assert 4 <= len(doc.splitlines()) <= 7
    facts = {"actor": "the Harbour Trust", "action": "sold", "count": "7", "things": "farms",
             "place": "Oban"}
    assert synthetic.summary_of(facts) == "The Harbour Trust has sold 7 farms in Oban."


def test_generation_is_deterministic(tmp_path):
    synthetic.write_synthetic(tmp_path / "a", sizes=SIZES, seed=5)
    synthetic.write_synthetic(tmp_path / "b", sizes=SIZES, seed=5)
    for rel in ("dataset/train/data-00000-of-00001.arrow",
                "models/synthetic-tokenizer/tokenizer.json"):
        assert (tmp_path / "a/xsum" / rel).read_bytes() == (tmp_path / "b/xsum" / rel).read_bytes()


def test_missing_and_corrupt_files_in_process(tmp_path, xsum_copy):
    with pytest.raises(DataMissing, match="ddl prepare --plugin xsum"):
        data.check(tmp_path / "empty", model="t5-tiny", tokenizer="t5-base")
    tokenizer = data.tokenizer_dir(xsum_copy, "t5-base", True) / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:1000])
    with pytest.raises(DataError, match=r"corrupt file .*tokenizer.json: not valid JSON"):
        data.check(xsum_copy, model="t5-tiny", tokenizer="t5-base")
    config = data.model_dir(xsum_copy, "t5-base", True) / "config.json"
    config.unlink()
    with pytest.raises(DataError, match=r"missing file .*synthetic-t5-base/config.json"):
        data.check_model_dir(config.parent, xsum_copy, weights=False)
    arrow = data.dataset_dir(xsum_copy) / "validation" / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(DataError, match=r"corrupt file .*validation.*arrow.*truncated"):
        data.check(xsum_copy, model="t5-tiny", tokenizer="t5-base")


def test_refuses_to_overwrite_real_data(tmp_path):
    (tmp_path / "xsum" / "dataset").mkdir(parents=True)
    (tmp_path / "xsum" / "dataset" / "dataset_dict.json").write_text("{}")
    with pytest.raises(DataError, match="refusing to overwrite"):
        synthetic.write_synthetic(tmp_path, sizes=SIZES)


def test_safetensors_truncation_is_detected(tmp_path):
    """Real runs read pretrained weights; a cut copy must be caught by the header check."""
    import torch
    from safetensors.torch import save_file

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    save_file({"w": torch.zeros(64, 64)}, str(model / "model.safetensors"))
    data.check_model_dir(model, tmp_path, weights=True)
    blob = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(blob[:-100])
    with pytest.raises(DataError, match="model.safetensors.*truncated"):
        data.check_model_dir(model, tmp_path, weights=True)


def test_corrupt_file_is_one_line_through_the_cli(xsum_copy, tmp_path):
    path = data.dataset_dir(xsum_copy) / "train" / "data-00000-of-00001.arrow"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    proc = run_ddl("train", "--plugin", "xsum", "--preset", "tiny", "--nproc", "1",
                   "--data-dir", str(xsum_copy), "--run-dir", str(tmp_path / "run"),
                   cwd=tmp_path)
    assert_one_line_error(proc, "corrupt file", str(path), "ddl prepare --plugin xsum")
    assert not (tmp_path / "run").exists()


def _closed_loopback_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connect is refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["offline-variable", "unreachable-hub"])
def test_real_prepare_fails_fast_in_one_line(tmp_path, case):
    """This machine cannot reach the Hub. Neither case sends anything off this machine:
    the offline variable stops before any connection, and the endpoint is a closed port
    on loopback (what an unreachable Hub looks like to the probe)."""
    env = {v: "" for v in data.OFFLINE_VARS}
    if case == "offline-variable":
        env["HF_HUB_OFFLINE"] = "1"
        needle = "HF_HUB_OFFLINE=1 is set"
    else:
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_loopback_port()}"
        needle = "cannot reach 127.0.0.1"
    started = time.monotonic()
    proc = run_ddl("prepare", "--plugin", "xsum", "--data-dir", str(tmp_path / "d"),
                   env=env, cwd=tmp_path, timeout=120)
    elapsed = time.monotonic() - started
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1 and "could not download XSum/T5" in lines[0], proc.stderr
    assert needle in lines[0] and "--synthetic" in lines[0]
    assert elapsed < 30, elapsed  # huggingface_hub alone retries for ~25 s per file
    assert not any((tmp_path / "d").glob("*")), "a failed download left files behind"


def test_listing_does_not_import_the_heavy_libraries():
    probe = ("import sys, ddl_xsum.plugin as p; p.ddl_register_workloads(); "
             "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'tokenizers') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, env={**os.environ}).stdout.strip()
    assert out == "[]", out


def test_ddl_plugins_lists_xsum_with_presets_and_capabilities(tmp_path):
    from ddl.contract.plugins import Plugins

    proc = run_ddl("plugins", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:1] == ["xsum"])
    assert "T5" in lines[i]
    assert ("presets: course (default), t5-small, t5-large, t5-3b, throughput, tiny; "
            "from ddl-xsum") in lines[i + 1]
    header = next(line for line in lines if line.startswith("Support"))
    names = lines[lines.index(header) + 1].split()
    support = next(line for line in lines[i + 2:] if line.split()[:1] == ["xsum"])
    cells = dict(zip(names, support.split()[1:]))
    assert cells == {"mesh": "yes", "ddp": "yes", "fsdp": "yes", "accelerate": "yes",
                     "pp": "yes", "tp": "yes", "fsdp+tp": "yes"}, support
    spec = Plugins().workload("xsum")
    assert spec.capabilities == {"fsdp_units", "tp_plan", "pipeline_splits"}
    assert spec.plugin == "xsum"  # found through its installed entry point
