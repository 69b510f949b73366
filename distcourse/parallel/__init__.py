"""One module per parallelism strategy; each is checked against one process."""
