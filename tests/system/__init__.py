# A package, so that tests/system/conftest.py is imported as `system.conftest` and does not
# replace the shared tests/conftest.py as the module `conftest` (every test file does
# `from conftest import ...`; two top-level `conftest` modules would shadow each other).
