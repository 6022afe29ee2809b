"""The commit protocol: pre-commit on executors, the write-ahead log, the coordinator that
commits each batch to its Delta tables once its checkpoint completes, and recovery.
See PROTOCOL.md.
"""
