"""A reclock source plugin that keeps file states: ``.txt`` notes in a folder (see ``notefiles.source``)."""
