"""Reference workloads and the ablation benchmark."""
