"""Airflow provider for streamkeeper: hook, operators, deferrable sensors, triggers, alerts.

A top-level package beside `streamkeeper`, not inside it: the runtime stays free of
Airflow, imports go one way (this package uses `streamkeeper.client`, never the other
way), and the class paths Airflow persists (triggers in its database, hooks by
connection type) stay the same if this package later ships as its own distribution.
See README.md in this folder.
"""

from __future__ import annotations

__version__ = "0.1.0"
