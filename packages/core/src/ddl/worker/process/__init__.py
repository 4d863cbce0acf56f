"""The process room: one training process, from its start to its last line.

- ``entry``: the one code path every worker runs, however it was started (``python -m
  ddl.worker``, srun, a per-node launcher, the local fork server): read the run plan,
  join, bind, train, and turn a failure into one line.
- ``distributed``: the process group (who am I, which device, which backend) and
  ``seed_all``; ``mesh``: the run's one DeviceMesh, built once from the layout.
- ``cpu_binding``: binds the rank to the cores the run plan gives it and sets its
  ``threads`` (both decided in the pre-flight, ddl.settings.cores).
- ``heartbeat``: a heartbeat per rank, so that a stopped rank is noticed.
- ``crash``: a worker's exception told in one line; ``plugin_code``: where it passed
  through a plugin's own code.
- ``socket_folder``: where this process's Unix sockets go (short paths).
"""
