"""What a plugin's own test suite needs to run ddl's conformance kit on its workload.

Run it in the environment where the plugin is installed: `python -m pytest tests`.
"""

from ddl import conformance


def test_example_workload_keeps_the_ddl_contract(tmp_path):
    # In-process checks, then 1- vs 2-process DDP and every supported strategy via `ddl train`.
    conformance.check_workload("example", tmp_path)
