"""The Imagewoof workload of the JSC intro talk (fastai's distrib.py example), as a ddl plugin."""
