"""``python -m ddl.worker``: one worker process, as the launchers start it."""

from ddl.worker.process.entry import start

start()
