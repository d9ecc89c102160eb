"""The router process: the composition root, its lifecycle (health, reload, drain) and the CLI."""

__version__ = "0.1.0"
