"""Lifecycle chaos: blue-green upgrades and rollbacks of the sample job through the real
Airflow components, with a crash at a point of a handover or a rollback, or an Airflow
component or task process killed mid-upgrade; then exact output, a clean Delta log audit
and nothing left behind.

    scenarios.py        the faults, by name (the benchmark's rows)
    world.py            one run's folders, specs, input and environment
    airflow_control.py  triggering DAGs, reading task instances, finding a task's process
    orchestrator.py     the Airflow-side faults, each made when its moment comes
    checks.py           the tables against a reference from the input files
    run.py              one run, start to checks: `LifecycleRun(scenario, base).run()`

`python -m tests.support.lifecycle_chaos SCENARIO --workdir DIR` runs one in its own process
(Airflow reads its home when it is imported) and prints its report as the last line, in
JSON; `benchmarks/lifecycle_chaos.py` runs the matrix, tests/chaos/test_lifecycle_chaos.py
one combined run in CI.
"""
