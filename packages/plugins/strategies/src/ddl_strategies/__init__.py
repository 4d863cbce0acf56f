"""PyTorch-native parallelism strategies for ddl, one readable module each."""
