"""Helpers of benchmarks/gpu_check.py (the GPU check kit); docs/measuring.md describes it."""
