"""Scaling out: torchrun launch, DDP/FSDP wrapping, NCCL settings."""
