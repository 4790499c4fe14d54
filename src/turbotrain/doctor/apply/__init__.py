"""A fix applied to a running script without editing its file, for the what-ifs that time it in the script's own
processes: a job's change on every rank (``change``), DDP's or FSDP's sync on one micro-batch in K
(``sync_every``), the work under an ``if`` run N times less often (``rarer_branch``)."""
