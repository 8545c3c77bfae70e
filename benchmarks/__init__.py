"""reclock's benchmark harness: every claim is a ratio against a baseline measured in the same run."""
