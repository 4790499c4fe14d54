"""Rules on the step itself: precision, layout, kernels, the optimizer, host syncs, batch and layer sizes."""
