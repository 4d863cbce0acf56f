"""Data-loading throughput of the imagewoof pipeline: images/s, and per worker, for a range
of DataLoader worker counts.

The real pipeline (JPEG decode, random resized crop, flip, normalise; the workload's own
datasets) on the synthetic Imagewoof the project generates in the official folder format,
read with the preset's batch size and no model, so only loading is timed
(``ddl_imagewoof.bench.dataset_throughput``: images drawn with replacement, so any preset
serves any ``--batches``). The first ``--warmup`` batches of each setting are not timed
(worker start-up, page cache).

    .venv/bin/python benchmarks/data_loading.py                  # course preset, 0,1,2 workers
    .venv/bin/python benchmarks/data_loading.py --preset tiny --workers 0,2 --batches 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe  # noqa: E402

RESULTS = HERE / "results" / "data_loading.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="course")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, help="default: a fresh synthetic copy")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # like one rank of a local run; workers are the variable
    from ddl.contract.plugins import Plugins
    from ddl_imagewoof.bench import dataset_throughput
    from ddl_imagewoof.data import is_synthetic

    spec = Plugins().workload("imagewoof")
    preset = spec.presets[args.preset]
    workload = spec.create(preset)
    with tempfile.TemporaryDirectory(prefix="ddl-loading-") as tmp:
        data_dir = args.data_dir or Path(tmp) / "imagewoof"
        if args.data_dir is None:
            subprocess.run([str(Path(sys.executable).with_name("ddl")), "prepare", "--plugin",
                            "imagewoof", "--synthetic", "--data-dir", str(data_dir)],
                           check=True, capture_output=True)
        # the preset's own pipeline (image size, augmentation, sample limits); the timing is
        # the plugin's, so this benchmark and the plugin's function measure the same way
        train = workload.datasets(data_dir)["train"]
        synthetic = is_synthetic(data_dir)  # a --data-dir may hold either
        rows = []
        for workers in (int(w) for w in args.workers.split(",")):
            rate = dataset_throughput(train, workers, args.batches,
                                      batch_size=preset.batch_size, warmup_batches=args.warmup)
            rows.append({"workers": workers, "images_per_s": rate,
                         "images_per_s_per_worker": rate / max(workers, 1)})
            print(f"{workers} worker(s): {rate:.0f} images/s "
                  f"({rate / max(workers, 1):.0f} per worker)", flush=True)
    result = {"benchmark": "data_loading", "workload": "imagewoof", "preset": args.preset,
              "image_size": workload.image_size, "batch_size": preset.batch_size,
              "batches": args.batches, "synthetic": synthetic, "runs": rows,
              "machine": describe()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
