"""Helpers for tests/test_hostile_round.py: broken tasks and misbehaving training commands."""
