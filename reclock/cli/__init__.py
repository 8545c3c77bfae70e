"""The command line, the top floor: ``reclock`` (:mod:`reclock.cli.main`), its status and control
command families, and the ``spark-submit`` entry (:mod:`reclock.cli.submit`)."""
