"""Running the selected kernels on torch tensors (needs torch)."""
