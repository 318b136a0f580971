"""Tests of the scripts and notebooks in examples/."""
