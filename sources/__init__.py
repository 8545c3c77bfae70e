"""``reclock.sources``: this folder is importable only under its package name.

The checkout keeps ``sources/`` at the top for readers, and ``reclock/sources`` links to it (the wheel
holds a real folder). Imported as a top-level ``sources`` (Python started in the checkout's root),
every class would load a second time under another name, and an ``isinstance`` or an
``except`` would silently miss the other copy's; so that import fails here, loudly.
"""

if __name__ != "reclock.sources":
    raise ImportError(f"import reclock.sources, not {__name__}: this folder is the package reclock.sources")
