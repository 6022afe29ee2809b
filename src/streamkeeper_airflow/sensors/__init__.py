"""Deferrable sensors: checkpoint progress, a healthy probation window, a command's result."""
