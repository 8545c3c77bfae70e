"""The job under ``spark-submit``: this file is the application, its arguments the ``reclock`` CLI's.

::

    spark-submit --master spark://host:7077 --conf spark.executor.memory=2g \\
        "$(python -c 'import reclock.cli.submit as s; print(s.__file__)')" --lake /data/lake start auctions

Everything runs as with ``reclock start``: the stored definition, the lock, the status tables,
stop by ``reclock stop`` or SIGTERM. Spark's settings are spark-submit's: the master and
deploy mode given to it win over the definition's ``[spark] master`` (the definition's
``[spark.conf]`` still applies on top), and reclock and the source's package are shipped to the
executors as with any cluster master (``reclock/job/spark.py``).

spark-submit runs a Python application as a script, and Python puts a script's folder first on
``sys.path``. This folder is the ``reclock.cli`` package: its modules (``main``, ``status``,
``control``) would become top-level modules that shadow any library's of the same name, so that
entry is removed before anything else is imported.
"""

from __future__ import annotations

import os
import sys

if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]

__all__: list[str] = []

if __name__ == "__main__":
    from reclock.cli.main import main

    sys.exit(main())
