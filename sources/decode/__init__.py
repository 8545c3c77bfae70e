"""Decoding: raw record values into an output's Arrow schema, a whole batch at a time.

A :class:`Decoder` turns a list of raw values (``bytes``, or ``None`` for a Kafka tombstone) into
:class:`Decoded`: one :class:`pyarrow.RecordBatch` holding the rows that decoded, in input order,
the input indices of those rows (``good``), and ``(index, kind, message)`` for every value that did
not. Every input index is in exactly one of the two, so a bad record never vanishes: the reader
turns it into an :data:`~reclock.sources.base.ERRORS` row with its coordinates or raises
:class:`~reclock.sources.base.RecordError` when the policy is ``fail``.

The stages, one module each:

* :mod:`~reclock.sources.decode.options`: a format's options, checked at definition (:func:`make_decoder`,
  :func:`as_schema`).
* :mod:`~reclock.sources.decode.formats`: the five formats (``json``, ``csv``, ``text``, ``bytes``,
  ``avro``) and the bulk parse.
* :mod:`~reclock.sources.decode.isolate`: which records of a set that fails to parse are bad. The one
  routine, with one contract, that the Kafka decoding and the files reader both call.
* :mod:`~reclock.sources.decode.screening`: cheap guesses that steer isolation through systematically
  bad data.
* :mod:`~reclock.sources.decode.avro`: Avro datums, and the Arrow schema of an Avro schema.
* :mod:`~reclock.sources.decode.confluent`: registry formats, values in the Confluent wire format
  decoded with their writer's schema (:mod:`~reclock.sources.decode.registry` resolves the ids,
  :mod:`~reclock.sources.decode.protobuf` turns Protobuf messages into rows).
* :mod:`~reclock.sources.decode.result`: what a decoder returns.
"""

from reclock.sources.decode.avro import avro_to_arrow_schema
from reclock.sources.decode.confluent import REGISTRY_FORMATS, RegistryDecoder
from reclock.sources.decode.formats import FORMATS, Decoder, Format
from reclock.sources.decode.options import as_schema, make_decoder, make_registry_decoder
from reclock.sources.decode.result import Decoded, RecordFault

__all__ = [
    "FORMATS",
    "REGISTRY_FORMATS",
    "Decoded",
    "Decoder",
    "Format",
    "RecordFault",
    "RegistryDecoder",
    "as_schema",
    "avro_to_arrow_schema",
    "make_decoder",
    "make_registry_decoder",
]
