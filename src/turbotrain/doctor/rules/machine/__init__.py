"""Rules on the machine the run shares: cores, threads and workers."""
