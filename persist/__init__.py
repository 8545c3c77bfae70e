"""``reclock.persist``: this folder is importable only under its package name.

The checkout keeps ``persist/`` at the top for readers, and ``reclock/persist`` links to it (the wheel
holds a real folder). Imported as a top-level ``persist`` (Python started in the checkout's root),
every class would load a second time under another name, and an ``isinstance`` or an
``except`` would silently miss the other copy's; so that import fails here, loudly.
"""

if __name__ != "reclock.persist":
    raise ImportError(f"import reclock.persist, not {__name__}: this folder is the package reclock.persist")
