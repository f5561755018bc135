"""Shared fixtures. Every process a test spawns is reaped here whatever happens."""
