"""``reclock ui``: a read-only web page over a lake, its pipelines' state, charts and one timeline.

:mod:`~reclock.ui.lake_view` reads the lake (one refresh at a time, whatever the number of
viewers), :mod:`~reclock.ui.views` shapes what it read into the JSON each panel draws, and
:mod:`~reclock.ui.server` serves that JSON and the page's static files (``static/``, the charts'
library included: the page needs no internet). Design: ``docs/design/20261125_status_page.md``.
"""
