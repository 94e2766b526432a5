"""Pieces shared by the demo and the tests: a tiny model and engine settings."""
