"""A multi-process job under the doctor: the launcher started with every rank recording itself (``launcher``,
through the ``sitecustomize`` of ``rank_main``), each rank's heartbeat and result (``rank_status``, ``across_nodes``
for ranks on other nodes), and a script that starts its own ranks (``own_ranks``)."""
