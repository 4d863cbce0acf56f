"""The MNIST workload of the BSC CTE-POWER course, as a ddl plugin."""
