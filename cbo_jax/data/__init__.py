"""Data shipped with the package (see README.md in this folder)."""
