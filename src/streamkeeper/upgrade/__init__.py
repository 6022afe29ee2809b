"""Blue-green upgrades: a new version (green) proves itself on a shadow run, then takes
over the live tables from exactly where the running version (blue) stopped.

See UPGRADE.md in this folder for the protocol: phases, what is written where, and why
live output stays exactly once across the handover and across a rollback.
"""
