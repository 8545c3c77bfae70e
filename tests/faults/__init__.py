"""Fault injection: the crash-anywhere harness and the independent lake reader it checks with."""
