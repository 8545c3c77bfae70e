"""The job: a pipeline as an operator knows it, stored in a lake and run under a lease.

Definitions (:mod:`reclock.job.config`), the lifecycle (create, run, stop, maintain:
:mod:`reclock.job.lifecycle`), the lease and stop requests, the Spark session, status snapshots
and tables, metrics, the operator commands (detach, redrive, set-offsets) and source kinds
(built-ins and plugins). It drives :mod:`reclock.runtime` and is driven by :mod:`reclock.cli`.
"""
