"""A reclock source plugin: JSON-lines sensor logs, one file per site (see ``sensorlog.source``)."""
