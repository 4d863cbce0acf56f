"""Data-loading throughput of the imagewoof pipeline: images/s, and per worker, for a range
of DataLoader worker counts, JPEG path against decode-cache path in the same run.

The real pipelines (the workload's own datasets and ``to_device``) on the synthetic
Imagewoof the project generates in the official folder format, read with the preset's batch
size and no model, so only loading is timed (``ddl_imagewoof.bench.dataset_throughput``:
images drawn with replacement, so any preset serves any ``--batches``):

  * jpeg:  decode, random resized crop, flip, normalise in the loader (``decode_cache`` off);
  * cache: copies out of the decode cache in the loader; the crops, flips and normalisation
    are ``to_device``'s work on the device, not the loader's, so they are not in this rate.
    They are timed once on the CPU, with one thread, with 0 workers
    (``cache_with_cpu_crops_images_per_s``): what a CPU run gets; on a GPU they run there.

``cache_over_jpeg`` is the ratio of the two loader rates at the same worker count, measured
in the same run. The first ``--warmup`` batches of each setting are not timed (worker
start-up, page cache); building the cache is timed once, separately (``cache_build_s``).

    .venv/bin/python benchmarks/data_loading.py                  # course preset, 0,1,2 workers
    .venv/bin/python benchmarks/data_loading.py --preset tiny --workers 0,2 --batches 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe  # noqa: E402

RESULTS = HERE / "results" / "data_loading.json"


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="course")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, help="default: a fresh synthetic copy")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # like one rank of a local run; workers are the variable
    cpu = torch.device("cpu")
    from ddl.contract.plugins import Plugins
    from ddl_imagewoof.bench import dataset_throughput
    from ddl_imagewoof.data import is_synthetic

    spec = Plugins().workload("imagewoof")
    preset = spec.presets[args.preset]
    workloads = {path: spec.create(dataclasses.replace(preset, options={
        **preset.options, "decode_cache": path == "cache"})) for path in ("jpeg", "cache")}
    workload = workloads["cache"]
    with tempfile.TemporaryDirectory(prefix="ddl-loading-") as tmp:
        data_dir = args.data_dir or Path(tmp) / "imagewoof"
        if args.data_dir is None:
            subprocess.run([str(Path(sys.executable).with_name("ddl")), "prepare", "--plugin",
                            "imagewoof", "--synthetic", "--data-dir", str(data_dir)],
                           check=True, capture_output=True)
        # the preset's own pipeline (image size, augmentation, sample limits); the timing is
        # the plugin's, so this benchmark and the plugin's function measure the same way
        start = time.perf_counter()
        trains = {path: w.datasets(data_dir)["train"] for path, w in workloads.items()}
        build_s = time.perf_counter() - start  # nothing to build where a cache was current
        synthetic = is_synthetic(data_dir)  # a --data-dir may hold either
        rows = []
        for workers in (int(w) for w in args.workers.split(",")):
            rates = {path: dataset_throughput(trains[path], workers, args.batches,
                                              batch_size=preset.batch_size,
                                              warmup_batches=args.warmup)
                     for path in ("jpeg", "cache")}
            rate = rates["cache"]  # the default path
            rows.append({"workers": workers, "images_per_s": rate,
                         "images_per_s_per_worker": rate / max(workers, 1),
                         "jpeg_images_per_s": rates["jpeg"],
                         "cache_over_jpeg": rates["cache"] / rates["jpeg"]})
            print(f"{workers} worker(s): cache {rate:.0f} images/s "
                  f"({rate / max(workers, 1):.0f} per worker), JPEG {rates['jpeg']:.0f} "
                  f"images/s: x{rates['cache'] / rates['jpeg']:.1f}", flush=True)
        with_crops = dataset_throughput(trains["cache"], 0, args.batches,
                                        batch_size=preset.batch_size, warmup_batches=args.warmup,
                                        move=lambda batch: workload.to_device(batch, cpu))
        print(f"cache + crops on the CPU (1 thread, 0 workers): {with_crops:.0f} images/s")
    result = {"benchmark": "data_loading", "workload": "imagewoof", "preset": args.preset,
              "image_size": workload.image_size, "batch_size": preset.batch_size,
              "batches": args.batches, "synthetic": synthetic,
              "cache_canvas": trains["cache"].dataset.canvas, "cache_build_s": build_s,
              "cache_with_cpu_crops_images_per_s": with_crops, "runs": rows,
              "machine": describe()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
