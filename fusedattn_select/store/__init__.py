"""Stores of decisions and serialized plans: a typed protocol, SQLite and memory implementations."""
