"""The time model, the ground floor: frontiers, bindings, stamping and the resume rules.

Pure values and functions over them, after timely's ``progress`` and Materialize's reclocking: a
:class:`~reclock.timeline.frontier.Frontier` of source time, the remap's
:class:`~reclock.timeline.bindings.Bindings` from source time to into time, the
:class:`~reclock.timeline.stamp.Stamper` that gives a record its into time, and the resume upper of
:mod:`reclock.timeline.resume`. It imports nothing else of reclock (an import-linter layer), so
every other floor, the sources and the tables can use it, and the property tests can run it alone.
Named ``timeline``, not ``time``, so it never shadows the standard library.
"""
