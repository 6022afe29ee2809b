"""NATS JetStream as a replayable source: offsets are stream sequence numbers.

Batch (start, end] holds exactly the stream's messages with start < seq <= end (on
`source.subject` if set). A task reads its range with "next message at or after seq on
subject" gets, one per message: a pure function of what the stream holds, so the replay
of a batch after a crash returns the same messages, and deleted messages leave the same
gaps every time. No consumer is created; the stream keeps no state for us.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from streamkeeper.errors import SourceError, SpecError
from streamkeeper.sources.offsets import parse_int_offset
from streamkeeper.spec import SourceSpec

if TYPE_CHECKING:
    from nats.aio.client import Client
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT = "streamkeeper_nats"
RAW_SCHEMA = "seq BIGINT, subject STRING, data STRING, timestamp TIMESTAMP"
# Option names as a spec writes them; Spark hands them to the source lower-cased.
USER_OPTIONS = ("maxMessagesPerTrigger", "messagesPerPartition", "failOnDataLoss", "timeout")


@dataclass(frozen=True)
class NatsConfig:
    """Everything a reader needs; plain values, so readers pickle to executors."""

    url: str
    stream: str
    subject: str | None = None
    max_messages: int | None = None  # maxMessagesPerTrigger
    messages_per_partition: int = 10_000  # sequences per Spark task
    fail_on_data_loss: bool = True  # retention dropped messages a batch still needs
    timeout: float = 10.0  # seconds per NATS request

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> NatsConfig:
        """Parse the data source options (case-insensitive).

        Raises:
            SpecError: naming an unknown or malformed option.
        """
        given = {key.lower(): value for key, value in options.items()}
        known = {name.lower(): name for name in USER_OPTIONS} | {
            "url": "url",
            "stream": "stream",
            "subject": "subject",
        }
        unknown = sorted(key for key in options if key.lower() not in known)
        if unknown:
            raise SpecError(
                f"unknown NATS source option(s) {unknown} in source.options; "
                f"valid options are {list(USER_OPTIONS)}"
            )
        if not given.get("url") or not given.get("stream"):
            raise SpecError("a NATS source needs source.url and source.stream")
        return cls(
            url=given["url"],
            stream=given["stream"],
            subject=given.get("subject") or None,
            max_messages=_int_option(given, "maxMessagesPerTrigger"),
            messages_per_partition=_int_option(given, "messagesPerPartition") or 10_000,
            fail_on_data_loss=_bool_option(given, "failOnDataLoss", default=True),
            timeout=float(_int_option(given, "timeout") or 10),
        )


def _int_option(given: Mapping[str, str], name: str) -> int | None:
    raw = given.get(name.lower())
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise SpecError(
            f"source option {name}={raw!r} must be a positive integer, e.g. {name}: 1000"
        )
    return int(raw)


def _bool_option(given: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = given.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise SpecError(f"source option {name}={raw!r} must be true or false")
    return raw.strip().lower() == "true"


# -- offsets and ranges (pure) ---------------------------------------------------------


def seq_offset(seq: int) -> dict[str, int]:
    """The offset JSON Spark checkpoints: the last stream sequence a batch covers."""
    return {"seq": seq}


def parse_seq(offset: Mapping[str, Any]) -> int:
    """The sequence in an offset.

    Raises:
        SourceError: the offset is not a NATS offset (the checkpoint belongs to another source).
    """
    return parse_int_offset(offset, "seq", 0, "NATS")


def next_end(start: int, last: int, *, target: int | None, max_rows: int | None) -> int:
    """The next batch's end: the stream's last sequence, capped by the AvailableNow target
    and the per-trigger row limit; `start` when there is nothing new."""
    end = last if target is None else min(last, target)
    if max_rows is not None:
        end = min(end, start + max_rows)
    return max(start, end)


def split_range(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """(start, end] cut into consecutive (a, b] ranges of at most `size` sequences."""
    return [(low, min(low + size, end)) for low in range(start, end, size)]


# -- network (asyncio.run per call: the reader itself holds no connection) -------------


async def _connect(config: NatsConfig) -> Client:
    import nats

    async def quiet(_error: Exception) -> None:  # failures surface as exceptions below
        return None

    try:
        return await nats.connect(
            config.url,
            connect_timeout=config.timeout,
            max_reconnect_attempts=3,
            reconnect_time_wait=0.5,
            error_cb=quiet,
        )
    except Exception as error:  # noqa: BLE001 - nats-py raises several unrelated types
        raise SourceError(
            f"cannot connect to NATS at {config.url!r} ({type(error).__name__}: {error}); "
            "check source.url and that the server is running"
        ) from None


async def _stream_bounds(client: Client, config: NatsConfig) -> tuple[int, int]:
    from nats.js.errors import NotFoundError

    try:
        info = await client.jetstream(timeout=config.timeout).stream_info(config.stream)
    except NotFoundError:
        raise SourceError(
            f"NATS stream {config.stream!r} does not exist at {config.url!r}; create it "
            "(e.g. `nats stream add`) or fix source.stream"
        ) from None
    return info.state.first_seq, info.state.last_seq


async def stream_bounds(config: NatsConfig) -> tuple[int, int]:
    """The stream's (first, last) sequence."""
    client = await _connect(config)
    try:
        return await _stream_bounds(client, config)
    finally:
        await client.close()


async def read_range(config: NatsConfig, start: int, end: int, batch_start: int) -> list[tuple]:
    """Rows (seq, subject, data, timestamp) of the messages with start < seq <= end."""
    from nats.js.errors import NotFoundError

    client = await _connect(config)
    try:
        first, last = await _stream_bounds(client, config)
        check_replayable(config, start, end, batch_start, first, last)
        js = client.jetstream(timeout=config.timeout)
        rows: list[tuple] = []
        seq = start + 1
        while seq <= end:
            try:
                # The next stored message at or after seq on the filter: gaps are skipped.
                msg = await js.get_msg(
                    config.stream, seq=seq, subject=config.subject or ">", next=True
                )
            except NotFoundError:
                break
            if msg.seq is None or msg.seq > end:
                break
            text = (msg.data or b"").decode("utf-8", errors="replace")
            rows.append((msg.seq, msg.subject, text, msg.time))
            seq = msg.seq + 1
        return rows
    finally:
        await client.close()


def check_not_behind(config: NatsConfig, last: int, offset: int) -> None:
    """Refuse a stream whose last sequence is below a checkpointed offset (it was recreated)."""
    if last < offset:
        raise SourceError(
            f"NATS stream {config.stream!r} ends at sequence {last}, below the checkpointed "
            f"offset {offset}: the stream was deleted and recreated. Start a new checkpoint "
            "(point checkpoint.dir at a new directory) to read it from the beginning"
        )


def check_replayable(
    config: NatsConfig, start: int, end: int, batch_start: int, first: int, last: int
) -> None:
    """Refuse a range the stream can no longer return in full."""
    check_not_behind(config, last, end)
    # The first batch of a query may start below `first` (older messages expired before
    # the job began); any later batch expects every sequence after its start to be there.
    if config.fail_on_data_loss and batch_start > 0 and first > start + 1:
        raise SourceError(
            f"NATS stream {config.stream!r} no longer holds sequences {start + 1}..{first - 1} "
            "that this batch must read (retention removed them before the job read them). "
            "Raise the stream's retention, or set source.options.failOnDataLoss: false to "
            "skip what is gone"
        )


# -- the Spark data source -------------------------------------------------------------


class NatsPartition(InputPartition):
    """Sequences (start, end] of one batch, read by one task."""

    def __init__(self, start: int, end: int, batch_start: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end
        self.batch_start = batch_start


class NatsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches on the driver and reads them on executors."""

    def __init__(self, config: NatsConfig) -> None:
        self.config = config
        self.target: int | None = None  # Trigger.AvailableNow stops here

    def initialOffset(self) -> dict:
        return seq_offset(0)  # before the first message

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_messages:
            return ReadMaxRows(self.config.max_messages)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = asyncio.run(stream_bounds(self.config))[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = parse_seq(start)
        last = asyncio.run(stream_bounds(self.config))[1]
        check_not_behind(self.config, last, begin)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return seq_offset(next_end(begin, last, target=self.target, max_rows=max_rows))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = parse_seq(start), parse_seq(end)
        ranges = split_range(begin, finish, self.config.messages_per_partition)
        return [NatsPartition(low, high, begin) for low, high in ranges]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, NatsPartition)
        yield from asyncio.run(
            read_range(self.config, partition.start, partition.end, partition.batch_start)
        )

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: the offsets are ours, retention is the stream's."""


class NatsDataSource(DataSource):
    """`spark.readStream.format("streamkeeper_nats")`: options url, stream, subject, ..."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return RAW_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NatsStreamReader(NatsConfig.from_options(self.options))


def build_nats_source(spark: SparkSession, source: SourceSpec) -> DataFrame:
    """The stream as `seq, subject, data, timestamp`, or `seq` plus `data` parsed as JSON
    into `source.schema`'s columns.

    Raises:
        SpecError: a bad option or schema.
        SourceError: the server is unreachable or the stream does not exist.
    """
    options = {**source.options, "url": source.url or "", "stream": source.stream or ""}
    if source.subject:
        options["subject"] = source.subject
    config = NatsConfig.from_options(options)
    asyncio.run(stream_bounds(config))  # fail here, with the fix, not in a Spark task
    spark.dataSource.register(NatsDataSource)
    frame = spark.readStream.format(FORMAT).schema(RAW_SCHEMA).options(**options).load()
    if not source.schema_ddl:
        return frame
    return _parse_json(frame, source.schema_ddl)


def _parse_json(frame: DataFrame, ddl: str) -> DataFrame:
    from pyspark.sql import functions as F

    try:
        parsed = frame.select("seq", F.from_json("data", ddl).alias("value"))
        columns = parsed.select("seq", "value.*")
    except Exception as error:  # noqa: BLE001 - Spark's parse errors are verbose
        raise SpecError(
            f"source.schema {ddl!r} is not a valid DDL schema ({str(error).splitlines()[0]}); "
            "expected e.g. 'key STRING, value BIGINT'"
        ) from None
    if columns.columns.count("seq") > 1:
        raise SpecError(
            f"source.schema {ddl!r} names a column 'seq', which the NATS source adds itself "
            "(the stream sequence); rename that field"
        )
    return columns
