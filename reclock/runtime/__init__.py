"""The runtime: what runs one pipeline's batches, over a source and a lake it is handed.

Settings, minting (probe, cap, mint), planning, the batch loop (:mod:`reclock.runtime.pipeline`),
the data planes and what a task does, shaping, windows, maintenance, batch reports, health and
log scopes. It knows the sources only by their contract (:mod:`reclock.sources.base`) and the lake
only through :mod:`reclock.persist`; it knows nothing of definitions in a lake, the job's lease,
status tables or the CLI, which live a floor up in :mod:`reclock.job`.
"""
