"""Training: the Trainer, its hot loop, stopping rules, checkpoints, logs and progress."""
