"""The CIFAR-10 / ResNet50 v2 workload of the BSC CTE-POWER course, as a ddl plugin."""
