"""Write canonical state into a checkpoint, in Spark's own state store format.

Both stores start from the same frame, built on the executors from the savepoint's
Parquet files (on the driver for a small savepoint, `DRIVER_STATE_BYTES`): the rows of
Spark's raw state form (`partition_key`, `key_bytes`, `value_bytes`,
`column_family_name`), keys and values converted to the new job's schema and encoded as
UnsafeRows (unsafe_row.py).

- HDFS-backed store: each partition's rows go into `state/{op}/{p}/{v}.delta`, the
  store's own file: per record the key's length, the key, the value's length, the value
  (big-endian ints), -1 at the end, compressed with the checkpoint's codec: lz4 (Spark's
  default) by the tasks that convert the rows, without a shuffle (by the driver for a
  small savepoint); any other through Spark's codec on the driver. The store refuses to
  be written empty any other way.
- RocksDB: Spark's state rewriter (`StateRewriter`, what `repartition` uses) writes each
  partition's rows on the executors through `StatePartitionAllColumnFamiliesWriter`,
  with the encoder and column families Spark derives from the operator's metadata; it
  is handed our frame in place of the state it would have read.

A row's partition is `pmod(hash(key), partitions)`, Spark's Murmur3 over the key's
fields, the partitioning of every stateful operator's state.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.snapshots import savepoint_points
from streamkeeper.state import murmur3
from streamkeeper.state.schema import ValuePlan, arrow_type, reshape
from streamkeeper.state.unsafe_row import encode_struct
from streamkeeper.storage import Location
from streamkeeper.storage.parquet import open_parquet_whole

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

READ_BATCH_ROWS = 65_536
# A savepoint whose operators' Parquet files are this small in all is read, encoded and
# written on the driver: a Spark job with Python workers costs more than
# the rows themselves (0.6-0.75 s for 100 keys, most of a canonical upgrade's restore).
DRIVER_STATE_BYTES = 8 << 20
CODEC_CONF = "spark.sql.streaming.stateStore.compression.codec"
LZ4_BLOCK_CONF = "spark.io.compression.lz4.blockSize"
DEFAULT_STORE = "default"


@dataclass(frozen=True)
class SavepointRows:
    """The savepoint rows of one operator, read and converted where they are used.

    Attributes:
        convert: reads the operator table's files and converts their rows to Spark's
            raw state form with the new schema (None: the operator has no rows).
        raw_schema: the raw reader's schema for this operator in the new checkpoint.
    """

    convert: _RowConverter | None
    raw_schema: StructType

    @property
    def files(self) -> list[str]:
        return self.convert.files if self.convert is not None else []

    def frame(self, spark: SparkSession, on_driver: bool = False) -> DataFrame:
        """The rows as a DataFrame in Spark's raw state form.

        on_driver: read and convert here (a small savepoint, `DRIVER_STATE_BYTES`): the
            frame is a local relation rather than a job over the files.
        """
        if self.convert is None:
            return spark.createDataFrame([], self.raw_schema)
        if on_driver:
            converted = _converted_here(self.convert)
            if converted is None:
                return spark.createDataFrame([], self.raw_schema)
            return spark.createDataFrame(converted, self.raw_schema)
        return _one_task_per_file(spark, len(self.files)).mapInArrow(self.convert, self.raw_schema)


def savepoint_rows(
    files: list[str],
    location: Location,
    key_type: dict[str, Any],
    value_type: dict[str, Any],
    plan: ValuePlan,
    raw_schema: StructType,
) -> SavepointRows:
    """One operator's savepoint rows, to be converted to the new job's schema.

    Args:
        files: the operator table's data files (paths for `location`'s file system).
        location: any location of the savepoint: how executors reach the files.
        key_type, value_type: the new job's key and value types (Spark schema JSON).
        plan: how the savepoint's value becomes the new value (schema.check_compatible).
        raw_schema: the raw reader's schema for this operator in the new checkpoint.
    """
    if not files:
        return SavepointRows(None, raw_schema)
    partition_key = json.loads(raw_schema["partition_key"].dataType.json())
    convert = _RowConverter(location, key_type, value_type, plan, partition_key, files)
    return SavepointRows(convert, raw_schema)


def warm_python_workers(spark: SparkSession) -> Callable[[], None]:
    """Start, in the background, the Python workers that the state's tasks will use.

    A fresh worker spends most of a second importing (pyarrow, numpy, and pandas, which
    pyarrow loads on its first conversion) before its first row. A restore starts this
    before its bootstrap batch, which keeps the driver busy but not the executors' Python,
    and the state's tasks then find warm workers (Spark reuses idle ones). Returns a
    function that waits for it; a failure here is only logged: the tasks start their own.
    """
    from pyspark import InheritableThread

    count = spark.sparkContext.defaultParallelism

    def run() -> None:
        try:
            spark.range(0, count, 1, count).mapInArrow(_warm_worker, "ready boolean").collect()
        except Exception as error:  # noqa: BLE001 - a warm-up; the real job reports its own
            log.info("restore: warming the Python workers failed: %s", error)

    thread = InheritableThread(target=run, name="restore-warm-workers", daemon=True)
    thread.start()
    return thread.join


def _warm_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    from streamkeeper.state import hdfs_files, murmur3  # noqa: F401 - what the tasks import

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"ready": pa.array([True])})  # pandas, via pyarrow


def _one_task_per_file(spark: SparkSession, files: int) -> DataFrame:
    # A range of one id per partition: one task per file, as the export wrote them (a
    # round-robin repartition of the paths could give one task two files, another none).
    return spark.range(0, files, 1, files)


def _file_ids(files: int) -> pa.RecordBatch:
    import pyarrow as pa

    return pa.RecordBatch.from_pydict({"id": pa.array(range(files), pa.int64())})


class _RowConverter:
    """Executor side: read Parquet files, convert and encode their rows (picklable)."""

    def __init__(
        self,
        location: Location,
        key_type: dict[str, Any],
        value_type: dict[str, Any],
        plan: ValuePlan,
        partition_key: dict[str, Any],
        files: list[str],
    ) -> None:
        self.location = location
        self.key_type = key_type
        self.value_type = value_type
        self.plan = plan
        self.partition_key = partition_key
        self.files = files

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        filesystem = self.location.arrow_filesystem()
        for batch in batches:
            for index in batch.column("id").to_pylist():
                reader = open_parquet_whole(filesystem, self.files[index])  # retried on S3 errors
                for rows in reader.iter_batches(batch_size=READ_BATCH_ROWS):
                    yield self.encode(rows)

    def encode(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow as pa

        key = reshape(rows.column("key"), self.key_type, canonical=True)
        value = self.plan.apply(rows.column("value"), self.value_type)
        return pa.RecordBatch.from_arrays(
            [
                reshape(key, self.partition_key, canonical=False),
                encode_struct(key, self.key_type),
                encode_struct(value, self.value_type),
                pa.array([DEFAULT_STORE] * len(key), pa.string()),
            ],
            names=["partition_key", "key_bytes", "value_bytes", "column_family_name"],
        )


# -- HDFS-backed store ---------------------------------------------------------------


def write_hdfs_version(
    spark: SparkSession,
    rows: SavepointRows,
    checkpoint_dir: Path,
    operator_id: int,
    partitions: int,
    version: int,
    codec: str,
    on_driver: bool = False,
) -> None:
    """Write the rows as version `version` of every partition's `.delta` file.

    With Spark's default codec (lz4) the tasks that convert the rows write the files,
    and no row is shuffled: each task computes every row's state partition (Spark's
    `pmod(hash(key), n)`: in the same Python pass with murmur3.py for the key types it
    supports, else by Spark between two passes), frames and compresses its rows of
    partition p as one lz4 stream (hdfs_files.lz4_stream_compress) and renames it into
    place as a piece of p's file; the driver then joins each partition's pieces and the
    end of the file
    (-1, a stream of its own) into `{version}.delta`. Spark's LZ4 codec reads
    concatenated streams as one (lz4-java's `LZ4BlockInputStream` with concatenation
    on), and so does hdfs_files. No row passes through the driver; it moves or copies
    compressed bytes only. The directory must be one the executors share with the
    driver, as Spark's state store needs it to be. Other codecs, and a small state
    (`on_driver`), go through the driver: lz4 compressed there the same way, any other
    codec by Spark's.
    """
    operator_dir = checkpoint_dir / "state" / str(operator_id)
    if codec != "lz4":
        jvm = _JvmFiles(spark, codec)

        def through_spark(partition: int, body: np.ndarray) -> None:
            jvm.write_compressed(body, operator_dir / str(partition) / f"{version}.delta")

        _write_hdfs_on_driver(spark, rows, on_driver, partitions, through_spark)
        return
    from pyspark.sql import functions as F

    block_size = int(spark.sparkContext._jsc.sc().conf().getSizeAsBytes(LZ4_BLOCK_CONF, "32k"))
    files = _PartitionFiles(str(operator_dir), version, block_size, partitions)
    written: list[Any] = []
    if on_driver:
        _write_hdfs_on_driver(spark, rows, True, partitions, files.write)
        return
    if rows.convert is not None and murmur3.supports(rows.convert.partition_key):
        written = (
            _one_task_per_file(spark, len(rows.files))
            .mapInArrow(_ConvertAndWrite(rows.convert, files), _PIECES_SCHEMA)
            .collect()
        )
    elif rows.convert is not None:
        written = (
            rows.frame(spark)
            .select(
                # Spark's HashPartitioning of the state: pmod(Murmur3(key's fields, 42), n).
                F.pmod(F.hash("partition_key"), F.lit(partitions)).alias("partition"),
                "key_bytes",
                "value_bytes",
            )
            .mapInArrow(files.pieces, _PIECES_SCHEMA)
            .collect()
        )
    # A crash from here leaves only the restore's work folder: the checkpoint appears in
    # one rename, after the joins, and the next restore starts again (PROTOCOL.md).
    savepoint_points.reached("restore_state_after_pieces")
    for partition in range(partitions):
        tasks = sorted({row.task for row in written if row.partition == partition})
        files.join(partition, tasks)


_PIECES_SCHEMA = "task int, partition int, rows long"


class _ConvertAndWrite:
    """Task side, one Python pass: convert a file's rows, partition them, write pieces."""

    def __init__(self, convert: _RowConverter, files: _PartitionFiles) -> None:
        self.convert = convert
        self.files = files

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from self.files.pieces(self._partitioned(batches))

    def _partitioned(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for rows in self.convert(batches):
            numbers = murmur3.partition(
                rows.column("partition_key"), self.convert.partition_key, self.files.partitions
            )
            yield pa.RecordBatch.from_arrays(
                [pa.array(numbers), rows.column("key_bytes"), rows.column("value_bytes")],
                names=["partition", "key_bytes", "value_bytes"],
            )


class _PartitionFiles:
    """The `{version}.delta` files of one operator's partitions (picklable).

    `pieces` runs in the tasks, `join` on the driver, `write` (a whole file) on either.
    """

    def __init__(self, operator_dir: str, version: int, block_size: int, partitions: int) -> None:
        self.operator_dir = operator_dir
        self.version = version
        self.block_size = block_size
        self.partitions = partitions

    def target(self, partition: int) -> Path:
        return Path(self.operator_dir) / str(partition) / f"{self.version}.delta"

    def piece(self, partition: int, task: int) -> Path:
        # Named by the task, not its attempt: a retried task replaces its own pieces.
        target = self.target(partition)
        return target.parent / f".{target.name}.piece-{task}"

    def pieces(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Task side: this task's rows, one piece per state partition they fall in."""
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        received = list(batches)
        if not received:
            return
        table = pa.Table.from_batches(received).sort_by("partition")
        numbers = table.column("partition").to_numpy()
        if numbers[0] < 0 or numbers[-1] >= self.partitions:
            raise RuntimeError(
                f"task {task} of the restore's state writer got rows of state partition "
                f"{int(numbers[0] if numbers[0] < 0 else numbers[-1])}, outside 0-"
                f"{self.partitions - 1}"
            )
        found = np.unique(numbers)
        bounds = np.searchsorted(numbers, np.append(found, self.partitions), side="left")
        for partition, start, stop in zip(found, bounds[:-1], bounds[1:], strict=True):
            part = table.slice(int(start), int(stop - start))
            records = frame_records(part.column("key_bytes"), part.column("value_bytes"), end=False)
            _write_atomically(self.piece(int(partition), task), _lz4(records, self.block_size))
        yield pa.RecordBatch.from_pydict(
            {
                "task": [task] * len(found),
                "partition": found.astype(np.int32),
                "rows": np.diff(bounds).astype(np.int64),
            },
            schema=pa.schema(
                [("task", pa.int32()), ("partition", pa.int32()), ("rows", pa.int64())]
            ),
        )

    def join(self, partition: int, tasks: list[int]) -> None:
        """Driver side: the partition's pieces, in task order, and the end -> its file."""
        target = self.target(partition)
        pieces = [self.piece(partition, task) for task in tasks]
        missing = [str(piece) for piece in pieces if not piece.is_file()]
        if missing:
            raise CheckpointRestoreError(
                f"the executors wrote the restored state ({', '.join(missing)}) where this "
                "driver cannot see it: put the checkpoint on a file system that the driver "
                "and the executors share (Spark's state store needs one)"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        try:
            if pieces:
                pieces[0].replace(temp)  # most often the only one: no byte is copied
            with open(temp, "ab") as out:
                for piece in pieces[1:]:
                    with open(piece, "rb") as source:
                        shutil.copyfileobj(source, out, 1 << 20)
                out.write(_lz4(_END_OF_FILE, self.block_size))
            temp.replace(target)
        finally:
            temp.unlink(missing_ok=True)
        for piece in pieces[1:]:
            piece.unlink()

    def write(self, partition: int, body: np.ndarray) -> None:
        """Compress a whole file's `body` into the partition's file (a temp, a rename)."""
        _write_atomically(self.target(partition), _lz4(body, self.block_size))


_END_OF_FILE = np.full(4, 0xFF, dtype=np.uint8)  # -1, big-endian: no more records


def _lz4(body: np.ndarray, block_size: int) -> bytes:
    """Lz4-java's block stream of `body` (hdfs_files: imported where it runs)."""
    from streamkeeper.state.hdfs_files import lz4_stream_compress

    return lz4_stream_compress(body, block_size)


def _write_atomically(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        temp.write_bytes(data)
        temp.replace(target)
    finally:
        temp.unlink(missing_ok=True)


def _write_hdfs_on_driver(
    spark: SparkSession,
    rows: SavepointRows,
    on_driver: bool,
    partitions: int,
    write: Callable[[int, np.ndarray], None],
) -> None:
    """The rows through the driver's memory: `write(partition, records)` for each one.

    on_driver: the rows are read and converted here too (a small savepoint); their
    partitions are then computed here with murmur3.py where it supports the key, so no
    Spark job runs at all. Otherwise Spark converts them and computes the partitions.
    """
    if on_driver and rows.convert is not None and murmur3.supports(rows.convert.partition_key):
        table = _partitioned_here(rows.convert, partitions)
    else:
        from pyspark.sql import functions as F

        table = (
            rows.frame(spark, on_driver)
            .select(
                F.pmod(F.hash("partition_key"), F.lit(partitions)).alias("partition"),
                "key_bytes",
                "value_bytes",
            )
            .toArrow()
        )
    table = table.sort_by("partition")
    bounds = np.searchsorted(
        table.column("partition").to_numpy(), np.arange(partitions + 1), side="left"
    )
    for partition in range(partitions):
        part = table.slice(bounds[partition], bounds[partition + 1] - bounds[partition])
        write(partition, frame_records(part.column("key_bytes"), part.column("value_bytes")))


def _partitioned_here(convert: _RowConverter, partitions: int) -> pa.Table:
    """Read and convert every file here; each row with its partition (murmur3.py)."""
    import pyarrow as pa

    columns = ["partition", "key_bytes", "value_bytes"]
    converted = _converted_here(convert)
    if converted is None:
        return pa.table([pa.array([], pa.int32()), *[pa.array([], pa.binary())] * 2], columns)
    key = converted.column("partition_key")
    numbers = murmur3.partition(key, convert.partition_key, partitions)
    return pa.table(
        [numbers, converted.column("key_bytes"), converted.column("value_bytes")], names=columns
    )


def _converted_here(convert: _RowConverter) -> pa.Table | None:
    """Every savepoint file read and converted in this process; None if none has rows."""
    import pyarrow as pa

    batches = list(convert(iter([_file_ids(len(convert.files))])))
    return pa.Table.from_batches(batches) if batches else None


def frame_records(keys: pa.Array, values: pa.Array, end: bool = True) -> np.ndarray:
    """The records of a `.delta` file: (len, key, len, value)* then -1, big-endian ints.

    `end=False` leaves the -1 out: a piece that more records may follow.
    """
    key_offsets, key_data = _binary_parts(keys)
    value_offsets, value_data = _binary_parts(values)
    key_lengths, value_lengths = np.diff(key_offsets), np.diff(value_offsets)
    sizes = 8 + key_lengths + value_lengths
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    out = np.empty(int(starts[-1]) + (4 if end else 0), dtype=np.uint8)
    if end:
        out[-4:] = _END_OF_FILE
    if len(sizes):
        _put(out, starts[:-1], key_lengths)
        _ragged(out, starts[:-1] + 4, key_offsets, key_data)
        _put(out, starts[:-1] + 4 + key_lengths, value_lengths)
        _ragged(out, starts[:-1] + 8 + key_lengths, value_offsets, value_data)
    return out


def _binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], pa.binary())
    array = array.cast(pa.large_binary())
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    return offsets, (np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, np.uint8))


def _put(out: np.ndarray, starts: np.ndarray, numbers: np.ndarray) -> None:
    raw = numbers.astype(">i4").view(np.uint8).reshape(-1, 4)
    out[(starts[:, None] + np.arange(4)[None, :]).reshape(-1)] = raw.reshape(-1)


def _ragged(out: np.ndarray, targets: np.ndarray, offsets: np.ndarray, data: np.ndarray) -> None:
    lengths = np.diff(offsets)
    if not lengths.sum():
        return
    source = np.arange(offsets[0], offsets[-1], dtype=np.int64)
    out[source + np.repeat(targets - offsets[:-1], lengths)] = data[offsets[0] : offsets[-1]]


class _JvmFiles:
    """Files written through Spark's compression codec and Hadoop's file system."""

    def __init__(self, spark: SparkSession, codec: str) -> None:
        jvm = spark._jvm
        self.jvm = jvm
        self.conf = spark._jsparkSession.sessionState().newHadoopConf()
        spark_conf = spark.sparkContext._jsc.sc().conf()
        self.codec = jvm.org.apache.spark.io.CompressionCodec.createCodec(spark_conf, codec)

    def write_compressed(self, body: np.ndarray, target: Path) -> None:
        """Compress `body` into `target` (temp file, then rename, as Spark does)."""
        raw = target.parent / f".{target.name}.{uuid.uuid4().hex}.raw"
        raw.parent.mkdir(parents=True, exist_ok=True)
        body.tofile(raw)
        try:
            path = self.jvm.org.apache.hadoop.fs.Path(str(target))
            temp = self.jvm.org.apache.hadoop.fs.Path(str(target.parent / f".{target.name}.tmp"))
            filesystem = path.getFileSystem(self.conf)
            stream = self.codec.compressedOutputStream(filesystem.create(temp, True))
            source = self.jvm.java.io.FileInputStream(str(raw))
            self.jvm.org.apache.hadoop.io.IOUtils.copyBytes(source, stream, 1 << 20, True)
            if not filesystem.rename(temp, path):
                raise OSError(f"cannot rename {temp} to {target}")
        finally:
            raw.unlink(missing_ok=True)


# -- RocksDB ---------------------------------------------------------------------------


class _StateReplacement:
    """A Scala `Dataset => Dataset` (py4j callback) for Spark's state rewriter.

    The rewriter reads each store of each operator and hands the frame to this function;
    it answers with our frame for that operator, repartitioned so that RDD partition p
    holds state partition p (the rewriter writes partition = task partition), or with
    the (empty) frame it read for an operator that starts empty.
    """

    def __init__(self, frames: Mapping[int, Any]) -> None:
        self.frames = frames

    def apply(self, state: Any) -> Any:
        options = state.queryExecution().analyzed().options()
        operator = int(options.get("operatorId"))
        return self.frames.get(operator, state)

    class Java:
        implements = ["scala.Function1"]


def rewrite_rocksdb(
    spark: SparkSession,
    checkpoint_dir: Path,
    frames: Mapping[int, DataFrame],
    partitions: int,
    read_batch: int,
    write_batch: int,
) -> None:
    """Write version `write_batch + 1` of every operator's RocksDB state from `frames`.

    `offsets/{write_batch}` must exist: the rewriter takes its confs from there.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(spark.sparkContext._gateway)
    jvm = spark._jvm
    replacements = {
        op: frame.repartition(partitions, "partition_key")._jdf for op, frame in frames.items()
    }
    function = _StateReplacement(replacements)
    none = jvm.scala.Option.empty()
    rewriter = jvm.org.apache.spark.sql.execution.streaming.state.StateRewriter(
        spark._jsparkSession,
        read_batch,
        write_batch,
        str(checkpoint_dir),
        spark._jsparkSession.sessionState().newHadoopConf(),
        none,
        jvm.scala.Option.apply(function),
        none,
    )
    rewriter.run()


def raw_state_schema(key_type: dict[str, Any]) -> StructType:
    """The raw reader's schema for a key type (what the RocksDB rewriter checks)."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": "partition_key", "type": key_type, "nullable": True, "metadata": {}},
                {"name": "key_bytes", "type": "binary", "nullable": True, "metadata": {}},
                {"name": "value_bytes", "type": "binary", "nullable": True, "metadata": {}},
                {"name": "column_family_name", "type": "string", "nullable": True, "metadata": {}},
            ],
        }
    )


def arrow_key_type(key_type: dict[str, Any]) -> pa.DataType:
    return arrow_type(key_type, canonical=False)
