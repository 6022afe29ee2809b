"""Alerts: a notifier writing to the task log and a pluggable sink (JSON lines, webhook)."""
