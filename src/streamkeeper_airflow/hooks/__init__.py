"""Hooks: the job control plane (`StreamkeeperHook`)."""
