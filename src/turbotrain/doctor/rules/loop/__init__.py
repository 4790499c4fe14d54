"""Rules on the loop around the step: validation, checkpoints, work every N steps, time no line explains."""
