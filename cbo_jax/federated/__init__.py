"""Federated learning on stacked agents (data sources so far; algorithms to come)."""
