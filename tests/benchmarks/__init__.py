"""Tests of the benchmark scripts in benchmarks/ (their plumbing, at smoke sizes)."""
