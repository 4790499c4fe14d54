"""Rules on torch.compile: graph breaks, recompiles, compile time against what compile buys."""
