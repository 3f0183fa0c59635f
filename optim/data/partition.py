"""A Spark partition read by its rank: whole into arrays (``streaming=False``), or into a local copy on the
rank's disk and streamed from it (``streaming=True``), with the validation rows split off when the stage
carries them too. Rank side: the driver makes these readers (:mod:`optim.data.dataframe`) and ships them in
the job; :class:`FrameRankData` opens a rank's partition with them.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from optim.carriers import Carrier
from optim.data import stream
from optim.data.arrays import ArrayDataset
from optim.data.decode import TensorColumns, arrow_to_arrays, row_weights
from optim.data.spool import spool, spool_folder
from optim.shares import Opened, RankData, RankEnv

__all__ = ["SPLIT_COLUMN", "ArrowShard", "CheckedParts", "FrameRankData", "SplitShard", "SplitStreamShard",
           "StreamShard"]

#: The column that marks validation rows in a stage that carries both (:func:`optim.data.dataframe.with_validation`).
SPLIT_COLUMN = "__tfnet_validation"


class FrameRankData(RankData):
    """A rank's partition of the stage's DataFrame, read by ``reader`` (one of this module's): streamed into a
    local copy (checked part by part as it is stored), or read whole and checked. ``validation``: validation
    data shipped apart (None when the partition carries its own rows of it, or there is none)."""

    def __init__(self, reader, validation: Carrier | None = None):
        self.reader, self.validation = reader, validation

    def open(self, rows: Iterable, rank: int, size: int, env: RankEnv) -> Opened:
        where = f"partition {rank}"
        if hasattr(self.reader, "spool"):
            folder = spool_folder(getattr(self.reader, "local_dir", None))
            made = self.reader.spool(rows, rank, folder, env.name, env.checks(where))
            local = list(made) if isinstance(made, tuple) else [made]
            train, val = made if isinstance(made, tuple) else (made, self.open_validation())
            return Opened(train, val, local)
        made = self.reader(rows, rank)
        train, val = made if isinstance(made, tuple) else (made, self.open_validation())
        if hasattr(train, "each_shard"):  # an epoch resumed on fewer ranks: each shard's rows checked apart
            return Opened(train.each_shard(env.check_values, where), val)
        return Opened(env.check_values(train, where), val)

    def evaluate(self, rows: Iterable, partition: int, size: int):
        return self.reader(rows, partition), 0, 1


class ArrowShard:
    def __init__(self, features, labels, single_label, augment=None, weight: TensorColumns | None = None):
        self.features, self.labels, self.single_label, self.augment = features, labels, single_label, augment
        self.weight = weight

    def __call__(self, batches, partition: int, presharded: bool = True) -> ArrayDataset:
        batches = list(batches)
        weights = [] if self.weight is None else [self.weight]
        arrays = arrow_to_arrays(batches, list(self.features) + list(self.labels) + weights, partition)
        n_feats, n_labels = len(self.features), len(self.labels)
        feats, labels = arrays[:n_feats], arrays[n_feats:n_feats + n_labels]
        w = None
        if weights:
            w = row_weights(arrays[-1], self.weight.columns[0], partition)
        return ArrayDataset(feats, labels or None, self.single_label, presharded=presharded, augment=self.augment,
                            weights=w)


def held_mask(batch, holdout=None) -> pa.Array:
    """Which rows of ``batch`` are validation rows: :data:`SPLIT_COLUMN`, or those ``holdout`` holds out (a pair of an
    :class:`~optim.data.holdout.HoldOut` and the columns it hashes: ``validation_split``)."""
    if holdout is None:
        return batch.column(batch.schema.get_field_index(SPLIT_COLUMN))
    rule, columns = holdout
    return pa.array(rule.mask_arrow(batch, columns))


class SplitShard:
    """``(batches, partition) -> (training ArrayDataset, validation ArrayDataset or None)``, split by
    :data:`SPLIT_COLUMN` (or by ``holdout``: :func:`held_mask`); only the training shard is augmented."""

    def __init__(self, reader: ArrowShard, val_reader: ArrowShard, holdout=None):
        self.reader, self.val_reader, self.holdout = reader, val_reader, holdout

    def __call__(self, batches, partition: int, presharded: bool = True):
        import pyarrow.compute as pc

        train, val = [], []
        for batch in batches:
            mask = held_mask(batch, self.holdout)
            train.append(batch.filter(pc.invert(mask)))
            val.append(batch.filter(mask))
        shard = self.reader(train, partition, presharded)
        if not sum(b.num_rows for b in val):  # no validation rows here: an empty shard (the others' sums still meet)
            labels = None if shard.labels is None else [a[:0] for a in shard.labels]
            weights = None if self.val_reader.weight is None else np.zeros(0, np.float32)
            return shard, ArrayDataset([a[:0] for a in shard.features], labels, shard.single_label, presharded=True,
                                       weights=weights)
        return shard, self.val_reader(val, partition, presharded)


class StreamShard:
    """A partition streamed (``streaming=True``): for training, read once into a local copy on the rank's
    disk (:meth:`spool`, :mod:`optim.data.spool`) and streamed from it every epoch; for
    evaluation, read once batch by batch (:meth:`__call__`)."""

    def __init__(self, features, labels, single_label, augment, shuffle_buffer, prefetch, block_rows, local_dir=None,
                 weight: TensorColumns | None = None, decode_images: bool = True):
        self.features, self.labels, self.single_label, self.augment = features, labels, single_label, augment
        self.shuffle_buffer, self.prefetch, self.block_rows = shuffle_buffer, prefetch, block_rows
        self.local_dir, self.weight = local_dir, weight
        #: store encoded images decoded (once, as the partition is stored) rather than decode them every epoch
        self.decode_images = decode_images

    def __call__(self, batches, partition: int, presharded: bool = True) -> stream.ArrowStream:
        return stream.ArrowStream(batches, self.decoder(partition))

    def decoder(self, partition: int, weight: TensorColumns | None | bool = True) -> stream.Decoder:
        """The decoder of this reader's columns; ``weight``: True for this reader's weight column, else the
        weight column to read (None: none)."""
        return stream.Decoder(self.features, self.labels, self.single_label, partition,
                              self.weight if weight is True else weight)

    def dataset(self, source, partition: int, augment=True, weight: TensorColumns | None | bool = True
                ) -> stream.StreamedDataset:
        return stream.StreamedDataset(source, self.decoder(partition, weight), self.augment if augment else None,
                                      self.shuffle_buffer, self.prefetch)

    def spool(self, batches, partition: int, folder: str, name: str, check=None) -> stream.StreamedDataset:
        """Reads ``batches`` (the partition) into ``folder``, checking each part with ``check``
        (:class:`optim.data.values.PartitionChecks`); returns the rank's training data."""
        rows = CheckedParts(self, partition, check)
        files = spool(stream.numbered(batches), folder, {"train": name}, lambda b: {"train": rows(b)},
                      self.block_rows)
        rows.finish()
        return self.dataset(files["train"], partition)


class CheckedParts:
    """Each numbered part of a partition, checked as it is stored: the rows of number columns read (a bad
    row raises BadRowError, as in memory), image columns decoded and stored as pixels (``decode_images``: an
    image that does not decode raises here, naming its row; without it they are checked for nulls and decoded
    each epoch), and ``check`` run on what was read; rows it leaves out are dropped."""

    def __init__(self, reader: StreamShard, partition: int, check=None):
        self.reader, self.partition, self.check = reader, partition, check
        self.seen = 0

    def __call__(self, batch):
        from optim.arrow import NULL, ColumnRead, is_image_shape, read_column

        first = self.seen
        self.seen += batch.num_rows
        specs = list(self.reader.features) + list(self.reader.labels)
        arrays = []
        for spec in specs:
            parts = []
            for c in spec.columns:
                col = batch.column(batch.schema.get_field_index(c))
                binary = pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)
                if len(spec.columns) == 1 and binary and is_image_shape(spec.shape):
                    if self.reader.decode_images:  # decoded once here; every epoch then reads pixels
                        pixels = read_column(col, ColumnRead(shape=spec.shape), on_bad="raise", column=c,
                                             partition=self.partition, row_offset=first).values
                        batch = batch.set_column(batch.schema.get_field_index(c), *stream.pixel_column(c, pixels))
                        parts.append(pixels)
                        break
                    if col.null_count:
                        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                        raise NULL.error(c, first + row, self.partition)
                    parts = None
                    break
                parts.append(read_column(col, ColumnRead(shape=spec.shape if len(spec.columns) == 1 else None),
                                         on_bad="raise", column=c, partition=self.partition,
                                         row_offset=first).values)
            arrays.append(None if parts is None else parts[0] if len(parts) == 1 else np.stack(parts, axis=1))
        weight = self.reader.weight
        if weight is not None:
            col = batch.column(batch.schema.get_field_index(weight.columns[0]))
            values = read_column(col, ColumnRead(), on_bad="raise", column=weight.columns[0], partition=self.partition,
                                 row_offset=first).values
            row_weights(values, weight.columns[0], self.partition, first)
        if self.check is None:
            return batch
        features, labels = arrays[:len(self.reader.features)], arrays[len(self.reader.features):]
        labels = None if not labels else labels[0] if self.reader.single_label else labels
        keep = self.check(features, labels, first)
        return batch if keep is None else batch.filter(pa.array(keep))

    def finish(self) -> None:
        if self.check is not None:
            self.check.finish()


class SplitStreamShard:
    """:class:`SplitShard` streamed: one read of the partition into two local copies, the training rows
    (checked) and the validation rows."""

    def __init__(self, reader: StreamShard, val_weight: TensorColumns | None = None, holdout=None):
        self.reader, self.val_weight, self.holdout = reader, val_weight, holdout
        self.local_dir = reader.local_dir

    def spool(self, batches, partition: int, folder: str, name: str, check=None):
        import pyarrow.compute as pc

        rows = CheckedParts(self.reader, partition, check)
        counts = {"train": 0, "val": 0}

        def route(batch):
            mask = held_mask(batch, self.holdout)
            batch = batch.select([i for i, n in enumerate(batch.schema.names) if n != SPLIT_COLUMN])
            out = {}
            for key, part in (("train", batch.filter(pc.invert(mask))), ("val", batch.filter(mask))):
                if part.num_rows:
                    (part,) = stream.numbered([part], counts[key])
                    counts[key] += part.num_rows
                    out[key] = rows(part) if key == "train" else part
            return out

        files = spool(batches, folder, {"train": name, "val": name + "-val"}, route, self.reader.block_rows)
        rows.finish()
        return self.reader.dataset(files["train"], partition), self.reader.dataset(files["val"], partition, False, self.val_weight)


