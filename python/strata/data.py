"""Readers for the data sets Strata's examples train on, into numpy arrays a
script indexes by the record numbers of its data tasks (job.tasks()).

    images, labels = read_idx_pair(data["train_images"], data["train_labels"])
    dense, keys, labels = read_criteo(data["train"])

The record numbering is the master's: record i is the i-th image of an IDX
file, the i-th line of a CTR file (docs/ctr-data.md).
"""

import gzip
import struct

import numpy as np

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _open(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array of its shape."""
    with _open(path) as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError("%s: not an IDX file (%d bytes)" % (path, len(data)))
    zero, kind, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind not in _IDX_TYPES or dims == 0:
        raise ValueError("%s: not an IDX file (magic %02x%02x%02x%02x)" % ((path,) + tuple(data[:4])))
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    dtype = np.dtype(_IDX_TYPES[kind])
    want = 4 + 4 * dims + int(np.prod(shape)) * dtype.itemsize
    if len(data) != want:
        raise ValueError("%s: %d bytes, its header %s says %d" % (path, len(data), shape, want))
    return np.frombuffer(data, dtype=dtype, offset=4 + 4 * dims).reshape(shape)


def read_idx_pair(images, labels):
    """Images scaled to [0, 1] as float32 {n, rows, cols} and labels as
    int64 {n}, checked to have the same count."""
    x = read_idx(images)
    y = read_idx(labels)
    if x.shape[0] != y.shape[0]:
        raise ValueError("%s has %d examples but %s has %d labels"
                         % (images, x.shape[0], labels, y.shape[0]))
    return x.astype(np.float32) / 255.0, y.astype(np.int64)


def _fmix(z):
    """splitmix64's finalizer over a uint64 array (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


CTR_DENSE = 13
CTR_FIELDS = 26


def read_criteo(path):
    """A CTR file in the Criteo text format (docs/ctr-data.md) as
    (dense float32 {n, 13}: sign(x) log1p(|x|), missing 0;
     keys int64 {n, 26}: the key of each categorical field's value, the
       same 64-bit numbers as the C++ reader's, as int64 bit patterns;
     labels float32 {n}).
    A bad line raises ValueError naming the file and line."""
    dense_rows, cat_rows, labels = [], [], []
    with _open(path) as f:
        for number, raw in enumerate(f, 1):
            line = raw.rstrip(b"\r\n")
            if not line:
                continue
            cols = line.split(b"\t")
            if len(cols) != 1 + CTR_DENSE + CTR_FIELDS:
                raise ValueError("%s:%d: %d fields, expected %d"
                                 % (path, number, len(cols), 1 + CTR_DENSE + CTR_FIELDS))
            try:
                label = int(cols[0])
                if label not in (0, 1):
                    raise ValueError("label %d" % label)
                dense_rows.append([int(c) if c else 0 for c in cols[1:1 + CTR_DENSE]])
                cat_rows.append([int(c, 16) if c else -1 for c in cols[1 + CTR_DENSE:]])
            except ValueError as e:
                raise ValueError("%s:%d: %s" % (path, number, e)) from None
            labels.append(label)
    if not labels:
        raise ValueError("%s: no records" % path)
    dense = np.asarray(dense_rows, dtype=np.float64)
    dense = (np.sign(dense) * np.log1p(np.abs(dense))).astype(np.float32)
    cats = np.asarray(cat_rows, dtype=object)
    missing = cats == -1
    values = np.where(missing, 0, cats).astype(np.uint64)
    field = (np.arange(CTR_FIELDS, dtype=np.uint64) + np.uint64(1)) << np.uint64(56)
    keys = np.where(missing, _fmix((np.uint64(0x80) << np.uint64(56)) | field),
                    _fmix(values ^ field))
    return dense, keys.view(np.int64), np.asarray(labels, dtype=np.float32)
