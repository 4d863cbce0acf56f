"""The worker side: what each training process runs once a launcher has started it.

``entry`` joins the process group and hands over to ``trainer``, whose loop is built from
``setup`` (plugins, model, optimizer, loaders), ``resume``, ``epoch`` (steps, validation),
``evaluation`` and ``results`` (results.json); around it the pieces of a run:
``distributed`` (process group, devices), ``loaders`` (sharded data loading),
``precision``, ``checkpoint``, ``control`` (stop requests, guards), ``metrics``, ``memory``,
``mfu``, ``profiling``, ``utilisation``, ``sync_bn`` (``--sync-bn``); ``observers``: rank 0's
``progress`` bar or lines, every rank's ``live`` state (``ddl watch``), rank 0's
``tensorboard_events``. Imports settings and the contract, never launching
or commands. ``python -m ddl.worker`` starts one worker (torch's launchers do that).
"""
