"""The `formwork batch` and `formwork extract` commands, and the executors they run a job on."""
