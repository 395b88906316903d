"""bbolt, the B+tree file format etcd keeps its data in: a reader and a
writer of our own (layout facts in layout.py).  No I/O beyond the file."""

from .layout import DEFAULT_PAGE_SIZE, Meta
from .reader import BoltError, BoltFile, Bucket
from .writer import BoltWriter, BucketValue

__all__ = ["DEFAULT_PAGE_SIZE", "BoltError", "BoltFile", "BoltWriter", "Bucket", "BucketValue", "Meta"]
