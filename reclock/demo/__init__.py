"""``reclock demo``: the embedded default (:mod:`reclock.demo.run`), its three-pipeline timeline
demo, the Kafka producer both use, and the embedded Tansu broker the tests share."""
