"""Rules on memory: where the step's peak goes, why a run ran out of it, and which fix fits."""
