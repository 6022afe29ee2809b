"""Local components the quickstart, the tests and the benchmarks run: Airflow's
api-server, scheduler, dag-processor and triggerer started one by one on 127.0.0.1
(`airflow.py`), and the process groups they run in (`process.py`)."""
