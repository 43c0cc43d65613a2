"""Executors other than the local worker pool (runner.py); each is an optional extra."""
