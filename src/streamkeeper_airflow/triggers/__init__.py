"""Triggers the triggerer imports by class path; each polls the control plane in a thread."""
