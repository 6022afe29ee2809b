"""Snapshots of a job's state: Spark's checkpoint directory, externalized checkpoints
(content-addressed files and manifests in object storage), restore and retention.
"""
