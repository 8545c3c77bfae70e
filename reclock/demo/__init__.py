"""``reclock demo``: the embedded default (:mod:`reclock.demo.run`), its timeline demo of four
pipelines, the Postgres transfers demo, the Kafka producer they use, and the embedded Tansu broker
and PostgreSQL server the tests and benchmarks share."""
