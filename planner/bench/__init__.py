"""The torch.distributed benchmark (torch imported lazily, only here)."""
