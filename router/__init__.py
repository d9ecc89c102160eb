"""Semantic routing: config, encoder, classifier, the routing engine, the server and the CLI."""

__version__ = "0.1.0"
