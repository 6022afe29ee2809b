"""Running a job: the runner (start order, attempts), the query supervisor (watchdog,
history), the Spark session and min-pause pacing.
"""
