"""The streamkeeper Airflow plugin (the operations page), for `[core] plugins_folder`.

The class lives in the provider package (`streamkeeper_airflow.plugin`); Airflow finds it
here among this module's names. Point `plugins_folder` at this folder, or put this one
line in your deployment's plugins folder.
"""

from streamkeeper_airflow.plugin import StreamkeeperPlugin

__all__ = ["StreamkeeperPlugin"]
