"""Rules on a multi-process job: ranks side by side, DDP and FSDP settings, gradient sync, NCCL."""
