#!/usr/bin/env bash
# Source this (after setup.sh) to start Spark drivers faster: a class-data sharing archive
# of the classes a driver loads, and a JIT and GC sized for short-lived test drivers.
#
# A driver spends most of its first seconds loading and verifying Spark's classes; the
# chaos tests start hundreds of them. The archive is dumped once by a short run of the
# sample job (`-XX:ArchiveClassesAtExit`) and mapped by every later driver
# (`-XX:SharedArchiveFile`). A JVM that cannot use it (another JDK, another classpath)
# ignores it and loads classes as usual, so it can only make a start faster.
#
# Usage: source infra/driver_jvm.sh   (needs VENV; exports PYSPARK_SUBMIT_ARGS)

DRIVER_JVM_FLAGS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_driver_jvm_key="$( (java -version 2>&1; "$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)') | sha256sum | cut -c1-12)"
DRIVER_JVM_ARCHIVE="$(cd "$VENV" && pwd)/spark-driver-$_driver_jvm_key.jsa"

if [ ! -s "$DRIVER_JVM_ARCHIVE" ]; then
  _driver_jvm_work="$(mktemp -d)"
  "$VENV/bin/python" -c "
from pathlib import Path
from jobs.keyed_totals.sample_events import write_event_files
write_event_files(Path('$_driver_jvm_work/events'), files=2, events_per_file=50)"
  PYSPARK_SUBMIT_ARGS="--driver-java-options '$DRIVER_JVM_FLAGS -XX:ArchiveClassesAtExit=$DRIVER_JVM_ARCHIVE' pyspark-shell" \
    STREAMKEEPER_SPARK_LOG_LEVEL=ERROR \
    "$VENV/bin/python" -m streamkeeper run jobs/keyed_totals/job.yaml --available-now \
    --root "$_driver_jvm_work/data" --checkpoint-dir "$_driver_jvm_work/checkpoint" \
    --set "source.path=$_driver_jvm_work/events" --set spark.master=local[2] \
    --set spark.shuffle_partitions=2 >"$_driver_jvm_work/run.log" 2>&1 ||
    echo "note: no class-data archive for Spark drivers (see $_driver_jvm_work/run.log)" >&2
  # The driver's JVM outlives its Python process while it writes the archive.
  for _ in $(seq 120); do
    pgrep -f "ArchiveClassesAtExit=$DRIVER_JVM_ARCHIVE" >/dev/null || break
    sleep 0.5
  done
  [ -s "$DRIVER_JVM_ARCHIVE" ] && rm -rf "$_driver_jvm_work"
fi
if [ -s "$DRIVER_JVM_ARCHIVE" ]; then
  export PYSPARK_SUBMIT_ARGS="--driver-java-options '$DRIVER_JVM_FLAGS -XX:SharedArchiveFile=$DRIVER_JVM_ARCHIVE' pyspark-shell"
else
  export PYSPARK_SUBMIT_ARGS="--driver-java-options '$DRIVER_JVM_FLAGS' pyspark-shell"
fi
unset _driver_jvm_key _driver_jvm_work
