"""Operators: start a job (and restart it with back-off), check its health, send commands."""
