"""Interop tests: the project against WS-RM implementations it did not write."""
