#!/usr/bin/env bash
# Source this (after setup.sh) to start Spark drivers faster: a class-data sharing archive
# of the classes a driver loads, and a JIT and GC sized for short-lived test drivers.
#
# A driver spends most of its first seconds loading and verifying Spark's classes; the
# chaos tests start hundreds of them. The archive is made once by `streamkeeper
# driver-archive` (what users run for their own drivers: runtime/class_data.py) and
# mapped by every later driver (`-XX:SharedArchiveFile`). A JVM that cannot use it
# (another JDK, another classpath) ignores it and loads classes as usual.
#
# Usage: source infra/driver_jvm.sh   (needs VENV; exports PYSPARK_SUBMIT_ARGS)

DRIVER_JVM_FLAGS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_driver_jvm_key="$( (java -version 2>&1; "$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)') | sha256sum | cut -c1-12)"
DRIVER_JVM_ARCHIVE="$(cd "$VENV" && pwd)/spark-driver-$_driver_jvm_key.jsa"

if [ ! -s "$DRIVER_JVM_ARCHIVE" ]; then
  # The product's own command (what users run on their driver hosts), without the flags
  # below: an archive maps whatever JIT and GC the JVM runs with.
  PYSPARK_SUBMIT_ARGS=pyspark-shell PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" \
    "$VENV/bin/python" -m streamkeeper driver-archive "$DRIVER_JVM_ARCHIVE" >/dev/null ||
    echo "note: no class-data archive for Spark drivers (streamkeeper driver-archive failed)" >&2
fi
if [ -s "$DRIVER_JVM_ARCHIVE" ]; then
  export PYSPARK_SUBMIT_ARGS="--driver-java-options '$DRIVER_JVM_FLAGS -XX:SharedArchiveFile=$DRIVER_JVM_ARCHIVE' pyspark-shell"
else
  export PYSPARK_SUBMIT_ARGS="--driver-java-options '$DRIVER_JVM_FLAGS' pyspark-shell"
fi
export DRIVER_JVM_ARCHIVE
unset _driver_jvm_key
