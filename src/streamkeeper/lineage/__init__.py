"""A job lineage's control plane: where its objects live, epochs (fencing), heartbeats,
commit markers.
"""
