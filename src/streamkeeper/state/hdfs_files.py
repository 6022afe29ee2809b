"""The HDFS-backed state store's own files, read and written in Python (numpy, pyarrow).

Spark's HDFS-backed store keeps partition p of operator o as `state/{o}/{p}/{v}.delta`
(the changes of version v) and now and then `{v}.snapshot` (every row of version v).
Both files are a stream of records compressed with the checkpoint's codec:

    key length (int32 BE) | key (UnsafeRow) | value length (int32 BE) | value (UnsafeRow)

a removal has value length -1 and no value; -1 as a key length ends the file. Version v
is its latest snapshot at or below v, then every later delta up to v, in order.

Spark's LZ4 codec is lz4-java's block stream (`LZ4BlockOutputStream`): per block the
magic `LZ4Block`, a token (method | level), compressed and original lengths and an
XXHash32 checksum (seed 0x9747b28c, masked to 28 bits) of the original bytes, all
little-endian, then the block; an empty block ends the stream. pyarrow's `lz4_raw`
codec does the blocks; the checksum is computed with numpy, many blocks at once.
zstd (zstd-jni's standard frames) is read too; other codecs are not: callers fall back
to Spark's `statestore` reader.

UnsafeRows become Arrow arrays here (`decode_struct`), the inverse of unsafe_row.py:
vectorised over all rows, no Python per row except for decimals above 18 digits.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from streamkeeper.state.schema import arrow_type
from streamkeeper.state.unsafe_row import NULL_TYPES

MAGIC = b"LZ4Block"
_HEADER = struct.Struct("<8sBiii")  # magic, token, compressed, original, checksum
_METHOD_RAW, _METHOD_LZ4 = 0x10, 0x20
LZ4_BLOCK_SIZE = 32 * 1024  # spark.io.compression.lz4.blockSize's default
XXHASH_SEED = 0x9747B28C
READABLE_CODECS = ("lz4", "zstd")
_FILE = re.compile(r"^(\d+)\.(delta|snapshot)$")
_WORD = 8


class UnreadableState(Exception):
    """The files are not what this reader knows; read with Spark's reader instead."""


# -- files of a version ------------------------------------------------------------------


def version_files(partition_dir: Path, version: int) -> list[Path]:
    """The files that make up `version` of one partition, oldest first.

    Raises:
        UnreadableState: a file of the chain is missing (or the store names its files
            another way, e.g. checkpoint format version 2).
    """
    found: dict[tuple[int, str], Path] = {}
    if partition_dir.is_dir():
        for path in partition_dir.iterdir():
            match = _FILE.match(path.name)
            if match:
                found[(int(match.group(1)), match.group(2))] = path
    snapshots = [v for v, kind in found if kind == "snapshot" and v <= version]
    start = max(snapshots, default=0)
    chain = [found[(start, "snapshot")]] if start else []
    for v in range(start + 1, version + 1):
        if (v, "delta") not in found:
            raise UnreadableState(f"{partition_dir}/{v}.delta is missing")
        chain.append(found[(v, "delta")])
    return chain


def decompress(data: bytes, codec: str) -> bytes:
    """A state file's bytes as written before compression."""
    if codec == "lz4":
        return lz4_stream_decompress(data)
    if codec == "zstd":
        import io

        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            return reader.read()
    raise UnreadableState(f"codec {codec!r}")


def lz4_stream_decompress(data: bytes) -> bytes:
    """lz4-java's block stream -> the original bytes (checksums verified)."""
    parts: list[bytes] = []
    originals: list[bytes] = []
    sums: list[int] = []
    position, end = 0, len(data)
    view = memoryview(data)
    while position < end:
        magic, token, compressed, original, check = _HEADER.unpack_from(data, position)
        if magic != MAGIC:
            raise UnreadableState("not an LZ4 block stream")
        position += _HEADER.size
        if original == 0:
            continue  # the end of a stream (another may follow)
        block = view[position : position + compressed]
        position += compressed
        method = token & 0xF0
        if method == _METHOD_RAW:
            raw = bytes(block)
        elif method == _METHOD_LZ4:
            raw = pa.decompress(block, decompressed_size=original, codec="lz4_raw", asbytes=True)
        else:
            raise UnreadableState(f"LZ4 block method {method:#x}")
        parts.append(raw)
        originals.append(raw)
        sums.append(check & 0xFFFFFFFF)
    if originals and not np.array_equal(
        xxhash32_blocks(originals) & 0x0FFFFFFF, np.array(sums, dtype=np.uint32)
    ):
        raise UnreadableState("an LZ4 block's checksum does not match (corrupt file)")
    return b"".join(parts)


def lz4_stream_compress(body: bytes | np.ndarray, block_size: int = LZ4_BLOCK_SIZE) -> bytes:
    """The original bytes as lz4-java's block stream, as Spark's LZ4 codec writes it."""
    if not isinstance(body, bytes):
        body = np.ascontiguousarray(body, dtype=np.uint8).tobytes()
    body = memoryview(body)
    level = max(0, (block_size - 1).bit_length() - 10)
    blocks = [bytes(body[i : i + block_size]) for i in range(0, len(body), block_size)]
    sums = xxhash32_blocks(blocks) & 0x0FFFFFFF if blocks else []
    out = []
    for block, check in zip(blocks, sums, strict=True):
        packed = pa.compress(block, codec="lz4_raw", asbytes=True)
        if len(packed) >= len(block):
            method, packed = _METHOD_RAW, block
        else:
            method = _METHOD_LZ4
        out.append(_HEADER.pack(MAGIC, method | level, len(packed), len(block), int(check)))
        out.append(packed)
    out.append(_HEADER.pack(MAGIC, _METHOD_RAW | level, 0, 0, 0))
    return b"".join(out)


# -- XXHash32 of many blocks at once ----------------------------------------------------

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def xxhash32_blocks(blocks: list[bytes], seed: int = XXHASH_SEED) -> np.ndarray:
    """XXHash32 of every block (uint32 each), numpy across the blocks: one pass of the
    16-byte stripes for all of them (longest first, so the blocks still in a stripe are
    a prefix), then each block's tail."""
    count = len(blocks)
    if not count:
        return np.zeros(0, dtype=np.uint32)
    lengths = np.array([len(b) for b in blocks], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    widest = int(lengths.max())
    rows = np.zeros((count, widest + 16), dtype=np.uint8)
    for row, index in enumerate(order):
        rows[row, : lengths[index]] = np.frombuffer(blocks[index], dtype=np.uint8)
    sorted_lengths = lengths[order]
    result = np.empty(count, dtype=np.uint32)
    with np.errstate(over="ignore"):
        result[order] = _xxhash32_rows(rows, sorted_lengths, seed)
    return result


def _xxhash32_rows(rows: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
    u32 = np.uint32
    seed32, p1, p2, p3, p4, p5 = (u32(x) for x in (seed, _P1, _P2, _P3, _P4, _P5))
    count = len(lengths)
    stripes = lengths // 16
    words = rows[:, : (rows.shape[1] // 16) * 16].view("<u4").reshape(count, -1, 4)
    lanes = np.empty((count, 4), dtype=u32)
    lanes[:] = [seed32 + p1 + p2, seed32 + p2, seed32, seed32 - p1]
    active = count
    for stripe in range(int(stripes.max())):
        while active and stripes[active - 1] <= stripe:  # lengths sorted longest first
            active -= 1
        part = lanes[:active]
        part += words[:active, stripe, :] * p2
        part[:] = _rotl(part, 13)
        part *= p1
    v = [lanes[:, i] for i in range(4)]
    long_hash = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
    h = np.where(lengths >= 16, long_hash, seed32 + p5) + lengths.astype(u32)
    position = stripes * 16
    index = np.arange(count)
    for _ in range(3):  # the tail's 4-byte words (at most 3)
        more = position + 4 <= lengths
        if not more.any():
            break
        at = np.minimum(position, rows.shape[1] - 4)
        word = rows[index[:, None], at[:, None] + np.arange(4)[None, :]].copy().view("<u4")
        mixed = _rotl(h + word.reshape(-1) * p3, 17) * p4
        h = np.where(more, mixed, h)
        position = np.where(more, position + 4, position)
    for _ in range(3):  # then its bytes (at most 3)
        more = position < lengths
        if not more.any():
            break
        byte = rows[index, np.minimum(position, rows.shape[1] - 1)].astype(u32)
        h = np.where(more, _rotl(h + byte * p5, 11) * p1, h)
        position = np.where(more, position + 1, position)
    h ^= h >> u32(15)
    h *= p2
    h ^= h >> u32(13)
    h *= p3
    h ^= h >> u32(16)
    return h


# -- records ------------------------------------------------------------------------------


def parse_records(raw: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(key starts, key lengths, value starts, value lengths) of a file's records.

    A removal has value length -1. UnsafeRows are whole words, so records begin at
    multiples of 8; when every record has the first one's lengths (fixed-size rows, or
    equally long strings) the records are found without a Python loop.
    """
    size = len(raw) - 4
    if size < 0 or raw[size:] != b"\xff\xff\xff\xff":
        raise UnreadableState("a state file without its end marker")
    if size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    first_key = struct.unpack_from(">i", raw, 0)[0]
    first_value = struct.unpack_from(">i", raw, 4 + first_key)[0]
    if first_key > 0 and first_value > 0 and size % (8 + first_key + first_value) == 0:
        record = 8 + first_key + first_value
        starts = np.arange(0, size, record, dtype=np.int64)
        data = np.frombuffer(raw, dtype=np.uint8)
        keys = _be_int32(data, starts)
        values = _be_int32(data, starts + 4 + first_key)
        if (keys == first_key).all() and (values == first_value).all():
            n = len(starts)
            return (
                starts + 4,
                np.full(n, first_key, dtype=np.int64),
                starts + 8 + first_key,
                np.full(n, first_value, dtype=np.int64),
            )
    return _walk_records(raw, size)


def _walk_records(raw: bytes, size: int) -> tuple[np.ndarray, ...]:
    unpack = struct.Struct(">i").unpack_from
    key_starts, key_lengths, value_lengths = [], [], []
    position = 0
    while position < size:
        key = unpack(raw, position)[0]
        value = unpack(raw, position + 4 + key)[0]
        key_starts.append(position + 4)
        key_lengths.append(key)
        value_lengths.append(value)
        position += 8 + key + max(value, 0)
    if position != size:
        raise UnreadableState("a state file whose records do not end at its end marker")
    starts = np.array(key_starts, dtype=np.int64)
    lengths = np.array(key_lengths, dtype=np.int64)
    return starts, lengths, starts + lengths + 4, np.array(value_lengths, dtype=np.int64)


def _be_int32(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return _windows(data, starts, 4).view(">i4").reshape(-1).astype(np.int64)


def _windows(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """data[starts[i] : starts[i] + width] for every i, as an (n, width) array."""
    if not len(starts):
        return np.zeros((0, width), dtype=np.uint8)
    if len(data) < width:  # pragma: no cover - starts would be out of range
        raise UnreadableState("a row reaches past the end of its file")
    return np.lib.stride_tricks.sliding_window_view(data, width)[starts]


def read_rows(files: list[Path], codec: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of a version from its files: (bytes, key starts, value starts).

    Later files win; removed keys are left out.
    """
    chunks, key_starts, key_lengths, value_starts, value_lengths = [], [], [], [], []
    offset = 0
    for path in files:
        raw = decompress(path.read_bytes(), codec)
        ks, kl, vs, vl = parse_records(raw)
        chunks.append(raw)
        key_starts.append(ks + offset)
        key_lengths.append(kl)
        value_starts.append(vs + offset)
        value_lengths.append(vl)
        offset += len(raw)
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8) if chunks else np.zeros(0, np.uint8)
    if not chunks:
        empty = np.zeros(0, dtype=np.int64)
        return data, empty, empty
    ks, kl = np.concatenate(key_starts), np.concatenate(key_lengths)
    vs, vl = np.concatenate(value_starts), np.concatenate(value_lengths)
    if not (len(files) == 1 and files[0].name.endswith(".snapshot")):
        # A delta may put a key more than once (each put is logged as it happens).
        keep = _latest(data, ks, kl) & (vl >= 0)
        ks, vs = ks[keep], vs[keep]
    return data, ks, vs


def _latest(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A mask of each key's last record (keys compared by their bytes)."""
    import pyarrow.compute as pc

    if _surely_unique(data, starts, lengths):
        return np.ones(len(starts), dtype=bool)
    keys = _binary(data, starts, lengths)
    codes = pc.dictionary_encode(keys).indices.to_numpy()
    reverse = codes[::-1]
    _, first_in_reverse = np.unique(reverse, return_index=True)
    keep = np.zeros(len(codes), dtype=bool)
    keep[len(codes) - 1 - first_in_reverse] = True
    return keep


def _surely_unique(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """True if no two keys can be equal: their 64-bit hashes differ (a cheap first test).

    Keys are whole words (UnsafeRows), hashed word by word; equal hashes only send the
    keys to the exact test.
    """
    if len(starts) < 2:
        return True
    widest = int(lengths.max())
    if widest % _WORD or (lengths % _WORD).any() or int((starts + widest).max()) > len(data):
        return False
    words = np.ascontiguousarray(_windows(data, starts, widest)).view("<u8")
    words = np.where(np.arange(widest // _WORD)[None, :] < (lengths // _WORD)[:, None], words, 0)
    hashes = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for column in range(words.shape[1]):
            hashes ^= words[:, column] * np.uint64(0xC2B2AE3D27D4EB4F)
            hashes = (hashes << np.uint64(27)) | (hashes >> np.uint64(37))
            hashes *= np.uint64(0x165667B19E3779F9)
    hashes.sort()
    return not (hashes[1:] == hashes[:-1]).any()


def _binary(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = _gather(data, starts, lengths, int(offsets[-1]))
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(out)]
    )


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, total: int) -> np.ndarray:
    """data[starts[i] : starts[i] + lengths[i]] for every i, back to back."""
    if total == 0:
        return np.zeros(0, dtype=np.uint8)
    widest = int(lengths.max())
    if (lengths == widest).all():
        return _windows(data, starts, widest).reshape(-1)
    if widest * len(lengths) <= 4 * total and int((starts + widest).max()) <= len(data):
        rows = _windows(data, starts, widest)
        return rows[np.arange(widest)[None, :] < lengths[:, None]]
    ends = np.cumsum(lengths)
    index = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    return data[index]


# -- UnsafeRow -> Arrow -----------------------------------------------------------------


def decode_struct(data: np.ndarray, starts: np.ndarray, spark_type: dict[str, Any]) -> pa.Array:
    """The UnsafeRows at `starts` of `data` as a struct array (canonical form, schema.py).

    Raises:
        UnreadableState: a field type this decoder does not know (arrays, maps).
    """
    target = arrow_type(spark_type, canonical=True)
    fields = spark_type["fields"]
    bitset = (len(fields) + 63) // 64
    children = []
    for index, field in enumerate(fields):
        if bitset:
            word = _u64(data, starts + (index // 64) * _WORD)
            nulls = ((word >> np.uint64(index % 64)) & np.uint64(1)).astype(bool)
        else:  # pragma: no cover - a struct has at least one field
            nulls = np.zeros(len(starts), dtype=bool)
        slot_at = starts + (bitset + index) * _WORD
        children.append(
            _decode_field(data, starts, slot_at, nulls, field["type"], target[index].type)
        )
    return pa.StructArray.from_arrays(children, fields=list(target))


def _u64(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _windows(data, at, _WORD).view("<u8").reshape(-1)


def _decode_field(
    data: np.ndarray,
    row_starts: np.ndarray,
    slot_at: np.ndarray,
    nulls: np.ndarray,
    spark_type: Any,
    arrow: pa.DataType,
) -> pa.Array:
    n = len(row_starts)
    if isinstance(spark_type, str) and spark_type in NULL_TYPES:
        return pa.nulls(n, arrow)
    slot = _u64(data, slot_at) if n else np.zeros(0, dtype=np.uint64)
    if isinstance(spark_type, dict):
        if spark_type.get("type") != "struct":
            raise UnreadableState(f"type {spark_type.get('type')!r}")
        starts = row_starts + (slot >> np.uint64(32)).astype(np.int64)
        if not nulls.any():
            return decode_struct(data, starts, spark_type)
        # A null struct has no row to decode: decode the others, then put the nulls in.
        present = np.flatnonzero(~nulls)
        inner = decode_struct(data, starts[present], spark_type)
        positions = np.zeros(n, dtype=np.int64)
        positions[present] = np.arange(len(present))
        return inner.take(pa.array(positions, mask=nulls))
    if spark_type in ("string", "binary"):
        offsets = (slot >> np.uint64(32)).astype(np.int64)
        lengths = np.where(nulls, 0, (slot & np.uint64(0xFFFFFFFF)).astype(np.int64))
        binary = _binary(data, row_starts + offsets, lengths)
        large = pa.large_string() if spark_type == "string" else pa.large_binary()
        array = pa.Array.from_buffers(
            large, n, [_validity(nulls)] + binary.buffers()[1:], null_count=int(nulls.sum())
        )
        return array.cast(arrow)
    if spark_type.startswith("decimal"):
        return _decimal(data, row_starts, slot, nulls, spark_type, arrow)
    return _fixed(slot, nulls, spark_type, arrow)


def _validity(nulls: np.ndarray) -> pa.Buffer | None:
    if not nulls.any():
        return None
    return pa.array(~nulls, pa.bool_()).buffers()[1]


_NUMPY = {
    "boolean": np.uint8,
    "byte": np.int8,
    "short": np.int16,
    "integer": np.int32,
    "date": np.int32,
    "long": np.int64,
    "timestamp": np.int64,
    "timestamp_ntz": np.int64,
    "float": np.float32,
    "double": np.float64,
}


def _fixed(slot: np.ndarray, nulls: np.ndarray, spark_type: str, arrow: pa.DataType) -> pa.Array:
    kind = _NUMPY.get(spark_type)
    if kind is None:
        raise UnreadableState(f"type {spark_type!r}")
    width = np.dtype(kind).itemsize
    values = np.ascontiguousarray(slot.view(np.uint8).reshape(-1, _WORD)[:, :width]).view(kind)
    values = values.reshape(-1)
    mask = nulls if nulls.any() else None
    if spark_type == "boolean":
        return pa.array(values.astype(bool), pa.bool_(), mask=mask)
    if spark_type == "date":
        return pa.array(values, pa.int32(), mask=mask).view(pa.date32()).cast(arrow)
    if spark_type.startswith("timestamp"):
        unit = pa.timestamp("us", tz=arrow.tz if pa.types.is_timestamp(arrow) else None)
        return pa.array(values, pa.int64(), mask=mask).view(unit).cast(arrow)
    return pa.array(values, mask=mask).cast(arrow)


def _decimal(
    data: np.ndarray,
    row_starts: np.ndarray,
    slot: np.ndarray,
    nulls: np.ndarray,
    spark_type: str,
    arrow: pa.DataType,
) -> pa.Array:
    precision, scale = (int(p) for p in spark_type[len("decimal(") : -1].split(","))
    if precision <= 18:
        low = slot.view(np.int64)
        pairs = np.stack([low, np.where(low < 0, -1, 0).astype(np.int64)], axis=1)
        buffer = pa.py_buffer(np.ascontiguousarray(pairs).tobytes())
        return pa.Array.from_buffers(
            pa.decimal128(precision, scale),
            len(slot),
            [_validity(nulls), buffer],
            null_count=int(nulls.sum()),
        ).cast(arrow)
    import decimal

    values = []
    offsets = (slot >> np.uint64(32)).astype(np.int64)
    sizes = (slot & np.uint64(0xFFFFFFFF)).astype(np.int64)
    raw = data.tobytes() if len(nulls) else b""
    for null, start, offset, size in zip(nulls, row_starts, offsets, sizes, strict=True):
        if null:
            values.append(None)
            continue
        unscaled = int.from_bytes(raw[start + offset : start + offset + size], "big", signed=True)
        values.append(decimal.Decimal(unscaled).scaleb(-scale))
    return pa.array(values, pa.decimal128(precision, scale)).cast(arrow)


# -- export: an operator's partitions, read on the executors -----------------------------

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CODEC_CONF = "spark.sql.streaming.stateStore.compression.codec"
_REQUIRED_CONF = {
    "spark.sql.streaming.stateStore.rowChecksum.enabled": "false",
    "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
}
OUTPUT_ROWS = 131_072


class PartitionReader:
    """Executor side: partition numbers in, the partitions' rows out (canonical Arrow).

    Picklable; reads `state/{operator}/{p}/` of a local checkpoint directory.
    """

    def __init__(
        self,
        checkpoint_dir: str,
        operator_id: int,
        version: int,
        codec: str,
        key_type: dict[str, Any],
        value_type: dict[str, Any],
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.operator_id = operator_id
        self.version = version
        self.codec = codec
        self.key_type = key_type
        self.value_type = value_type

    def partition_dir(self, partition: int) -> Path:
        return Path(self.checkpoint_dir) / "state" / str(self.operator_id) / str(partition)

    def __call__(self, batches: Any) -> Any:
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                files = version_files(self.partition_dir(partition), self.version)
                data, key_starts, value_starts = read_rows(files, self.codec)
                for first in range(0, len(key_starts), OUTPUT_ROWS):
                    keys = key_starts[first : first + OUTPUT_ROWS]
                    values = value_starts[first : first + OUTPUT_ROWS]
                    yield pa.RecordBatch.from_arrays(
                        [
                            decode_struct(data, keys, self.key_type),
                            decode_struct(data, values, self.value_type),
                        ],
                        names=["key", "value"],
                    )


def partition_reader(
    checkpoint_dir: Path,
    conf: dict[str, str],
    operator_id: int,
    partitions: int,
    version: int,
    key_type: dict[str, Any],
    value_type: dict[str, Any],
) -> PartitionReader | None:
    """A reader of the operator's files if this module can read them, else None.

    `conf` is the query's pinned confs (`offsets/N`). None for RocksDB, a codec other
    than lz4 or zstd, row checksums, Avro encoding, a type the decoder does not know,
    or files named otherwise (checkpoint format version 2).
    """
    if conf.get(PROVIDER_CONF, HDFS_PROVIDER) != HDFS_PROVIDER:
        return None
    codec = conf.get(CODEC_CONF, "lz4")
    if codec not in READABLE_CODECS:
        return None
    if any(conf.get(key, default) != default for key, default in _REQUIRED_CONF.items()):
        return None
    if not (_decodable(key_type) and _decodable(value_type)):
        return None
    reader = PartitionReader(str(checkpoint_dir), operator_id, version, codec, key_type, value_type)
    try:
        for partition in range(partitions):
            version_files(reader.partition_dir(partition), version)
    except UnreadableState:
        return None
    return reader


def _decodable(spark_type: Any) -> bool:
    if isinstance(spark_type, dict):
        if spark_type.get("type") != "struct":
            return False
        return all(_decodable(f["type"]) for f in spark_type["fields"])
    return (
        spark_type in _NUMPY
        or spark_type in NULL_TYPES
        or spark_type in ("string", "binary")
        or spark_type.startswith("decimal")
    )
