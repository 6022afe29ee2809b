"""streamkeeper: Flink-grade fault tolerance and lifecycle for PySpark Structured Streaming."""

__version__ = "0.1.0"
