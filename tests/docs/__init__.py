"""Tests of the documentation: README.md and the pages in docs/."""
