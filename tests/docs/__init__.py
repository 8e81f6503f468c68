"""The documentation held to the repository: its links resolve, and its examples run."""
