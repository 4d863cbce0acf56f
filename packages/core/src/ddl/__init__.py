"""ddl: distributed deep learning, the same command on a laptop and a supercomputer.

Importing this package must stay cheap (no torch): the CLI's --help, listings and script
rendering depend on it.
"""

__version__ = "0.1.0"
