"""``python -m ddl.worker``: one worker process, as the launchers start it."""

from ddl.worker.entry import start

start()
