"""The worker side: what each training process runs once a launcher has started it.

In rooms by concern, each with a docstring listing what it holds:

- ``process``: one process from start to end: ``entry`` (the one code path every worker
  runs), the process group, the mesh, threads and CPU binding, heartbeats, crash lines.
- ``build``: the model a rank trains: built whole or on the meta device, materialised
  shard by shard, pretrained weights, the block options (checkpointing, compile, sync-bn).
- ``train``: the loop: ``setup``, ``trainer``, ``epoch``, ``step`` (one optimizer step, top
  to bottom), loaders, precision, lr schedule, stop control, exact metrics.
- ``checkpointing``: save, verify, choose and resume checkpoints, safely.
- ``observe``: what watches without changing the numbers: progress, live state,
  TensorBoard, the step breakdown, profiling, utilisation, results.json.

At the top: ``memory`` and ``mfu`` (what a rank holds, the FLOPs share of its peak).
``ddl plan``'s probes are in ddl.planning, above this layer. Imports settings and the
contract, never planning, launching or commands. ``python -m ddl.worker`` starts one
worker (torch's launchers do).
"""
