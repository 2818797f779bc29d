"""Reading stores: the chunk reader, per-step columns, the dataset, mixing, the TorchRL drop-in."""
