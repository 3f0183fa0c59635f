"""``TFDataset.from_delta``: a Delta Lake table as of a version or a time, read like Parquet files. Driver side
(the table's log, through the ``deltalake`` package, delta-rs: ``pip install tfnet[delta]``); the ranks read
their share of that version's files as :mod:`optim.data.parquet` has them do, with no Delta code on the ranks.

A Delta table is Parquet files and a log of which files make each version. The driver reads the log once
(``deltalake.DeltaTable``, no Spark and no JVM connector), takes the version's files and each file's partition
values, and hands them to the Parquet adapter through its seam for table formats
(:meth:`~optim.data.parquet.ParquetDataset.from_files`): the same checks before any job, the same errors naming the file
and the row, the same streamed reading on the ranks. ``storage_options`` are fsspec's, as for ``from_parquet``
and ``model_dir`` (``endpoint_url``, ``key``, ``secret``); the driver gives delta-rs the same endpoint and keys.

The version's schema is the table's, as Delta readers take it: a column that schema evolution added after a file
was written (``write_deltalake(..., schema_mode="merge")``) reads as nulls in that file's rows (a null where a value
is needed is then the usual ``BadRowError`` naming the file and the row). Under column mapping
(``delta.columnMapping.mode``), the files hold each column under its physical name (mode ``name``) or field id (mode
``id``), from the schema's ``delta.columnMapping.*`` metadata: a renamed column reads under its new name, a
dropped one is gone, and one added again under an old name reads as nulls in the files written before.
"""

from __future__ import annotations

import datetime

from optim.data import stream
from optim.data.parquet import FileColumn, ParquetDataset
from optim.errors import DataError
from tfnet import storage

__all__ = ["DeltaDataset", "delta_options", "delta_uri"]


def _import_deltalake():
    try:
        import deltalake
    except ImportError:
        raise ImportError("TFDataset.from_delta reads Delta tables with the deltalake package (delta-rs): "
                          "pip install 'tfnet[delta]' (or deltalake).") from None
    return deltalake


def delta_options(path: str, storage_options) -> dict | None:
    """fsspec's ``storage_options`` (s3fs's, gcsfs's or adlfs's, as ``from_parquet`` and ``model_dir`` take them) as
    delta-rs (``object_store``) takes them for the table's scheme. None for a local table.

    * ``s3://``: ``endpoint_url`` (or ``client_kwargs["endpoint_url"]``), ``key``, ``secret``, ``region``.
    * ``gs://``: ``endpoint_url`` (an emulator's; ``google_base_url``), ``token``: ``"anon"`` (no signature), a
      service-account file's path, or its contents as a dict. Other tokens (``"google_default"``, ``"cloud"``):
      delta-rs finds the application default credentials itself.
    * ``abfs://``, ``abfss://``, ``az://``: ``connection_string`` (its account, key, SAS and blob endpoint, or
      ``UseDevelopmentStorage=true``), ``account_name``, ``account_key``, ``sas_token``, ``tenant_id``,
      ``client_id``, ``client_secret``, ``account_host``, ``anon``.

    An ``http://`` endpoint is allowed (``allow_http``), as fsspec's libraries allow it.
    """
    if not storage.is_remote(path):
        return None
    scheme = path.split("://", 1)[0].lower()
    options = dict(storage_options or {})
    if scheme in ("gs", "gcs"):
        return _gcs_options(options)
    if scheme in ("abfs", "abfss", "az"):
        return _azure_options(options)
    return _s3_options(options)


def delta_uri(path: str) -> str:
    """The table's URI as delta-rs names its scheme: ``gs://`` for fsspec's ``gcs://`` too (delta-rs takes ``gcs://``
    down another road, OpenDAL's, which reads none of the options above and looks for credentials elsewhere)."""
    scheme, sep, rest = path.partition("://")
    return f"gs://{rest}" if sep and scheme.lower() == "gcs" else path


def _s3_options(options: dict) -> dict:
    out = {}
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    if options.get("key"):
        out["AWS_ACCESS_KEY_ID"] = options["key"]
    if options.get("secret"):
        out["AWS_SECRET_ACCESS_KEY"] = options["secret"]
    region = options.get("region") or (options.get("client_kwargs") or {}).get("region_name")
    out["AWS_REGION"] = region or "us-east-1"
    return out


def _gcs_options(options: dict) -> dict:
    import json

    out = {}
    if options.get("endpoint_url"):
        out["google_base_url"] = str(options["endpoint_url"]).rstrip("/")
        if out["google_base_url"].startswith("http://"):
            out["allow_http"] = "true"
    token = options.get("token")
    if token == "anon":
        out["google_skip_signature"] = "true"
    elif isinstance(token, dict):
        out["google_service_account_key"] = json.dumps(token)
    elif isinstance(token, str) and token.endswith(".json"):
        out["google_application_credentials"] = token
    return out


#: adlfs's keywords -> object_store's Azure keys
_AZURE_KEYS = {"account_name": "azure_storage_account_name", "account_key": "azure_storage_account_key",
               "sas_token": "azure_storage_sas_token", "tenant_id": "azure_storage_tenant_id",
               "client_id": "azure_storage_client_id", "client_secret": "azure_storage_client_secret"}
#: a connection string's fields -> adlfs's keywords
_CONNECTION_FIELDS = {"accountname": "account_name", "accountkey": "account_key", "sharedaccesssignature": "sas_token"}


def _azure_options(options: dict) -> dict:
    out = {}
    fields = {}
    for part in str(options.get("connection_string") or "").split(";"):
        name, _, value = part.partition("=")
        if name.strip():
            fields[name.strip().lower()] = value.strip()
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        out["azure_storage_use_emulator"] = "true"  # Azurite at its default address (object_store's choice)
    for field, keyword in _CONNECTION_FIELDS.items():
        if fields.get(field):
            out[_AZURE_KEYS[keyword]] = fields[field]
    for keyword, key in _AZURE_KEYS.items():
        if options.get(keyword):
            out[key] = str(options[keyword])
    if fields.get("blobendpoint"):
        out["azure_storage_endpoint"] = fields["blobendpoint"].rstrip("/")
    elif options.get("account_host"):
        out["azure_storage_endpoint"] = f"https://{options['account_host']}"
    elif fields.get("endpointsuffix") and fields.get("accountname"):
        protocol = fields.get("defaultendpointsprotocol") or "https"
        out["azure_storage_endpoint"] = f"{protocol}://{fields['accountname']}.blob.{fields['endpointsuffix']}"
    if options.get("anon") is True:
        out["azure_skip_signature"] = "true"
    if out.get("azure_storage_endpoint", "").startswith("http://"):
        out["allow_http"] = "true"
    return out


class DeltaDataset(ParquetDataset):
    """``TFDataset.from_delta(path, feature_cols, label_cols, feature_shapes, version, timestamp, storage_options)``
    (:meth:`open`): see the module. Parquet files whose table's log chose them (:meth:`ParquetDataset.from_files`).

    Args:
        path: The table's folder, a local path or a URI (``s3://bucket/table``).
        version: The table as of this version. Default: the newest.
        timestamp: The table as of this time (a ``datetime`` or an ISO 8601 string); not with ``version``.
        Others: as for :class:`~optim.data.parquet.ParquetDataset`.

    Raises:
        DataError: no Delta table at ``path``, a version that does not exist (naming those that do), a table whose
            rows the files alone do not give (deletion vectors), or a file that cannot be read.
        ColumnError: a column the table does not have.
    """

    road = "a Delta table"
    #: The table's version read.
    version: int

    def __init__(self, *args, **kwargs):
        raise TypeError("A Delta table is opened with TFDataset.from_delta(path, ...) (DeltaDataset.open), which reads "
                        "its log; DeltaDataset(...) would read every file in the folder, removed ones included.")

    @classmethod
    def open(cls, path: str, feature_cols, label_cols=None, feature_shapes=None, version: int | None = None,
             timestamp=None, storage_options=None, batch_size: int | None = None, augment=None,
             shuffle_buffer: int = stream.DEFAULT_SHUFFLE_BUFFER,
             prefetch: int = stream.DEFAULT_PREFETCH) -> DeltaDataset:
        """The table at ``path`` as of ``version`` or ``timestamp`` (the arguments of the class)."""
        import pyarrow as pa

        if version is not None and timestamp is not None:
            raise ValueError(f"Give `version` or `timestamp`, not both. Received: version={version!r}, "
                             f"timestamp={timestamp!r}")
        path = str(path)
        table = _open(path, version, timestamp, storage_options)
        read = int(table.version())
        features = set(getattr(table.protocol(), "reader_features", None) or [])
        if "deletionVectors" in features and _has_deletion_vectors(table):
            raise DataError(f"The Delta table at {path!r} (version {read}) has deletion vectors: its files hold "
                            "rows that were deleted. Rewrite it without them (OPTIMIZE, or purge) to read it here.")
        schema = pa.schema(table.schema().to_arrow())
        actions = pa.table(table.get_add_actions(flatten=True))
        columns = list(table.metadata().partition_columns)
        files, values = [], []
        paths = actions.column("path").to_pylist()
        for i, relative in enumerate(paths):
            files.append(_in_filesystem(storage.join(path, relative) if "://" not in relative and not
                                        relative.startswith("/") else relative))
            values.append({c: _typed(actions.column(f"partition.{c}")[i].as_py(), schema.field(c).type)
                           for c in columns})
        if not files:
            raise DataError(f"The Delta table at {path!r} holds no rows at version {read}.")
        order = sorted(range(len(files)), key=lambda k: files[k])
        out = cls.from_files(path, [files[k] for k in order], [values[k] for k in order], schema, feature_cols,
                             label_cols, feature_shapes, storage_options=storage_options, batch_size=batch_size,
                             augment=augment, shuffle_buffer=shuffle_buffer, prefetch=prefetch,
                             stored=_stored_columns(table, path), absent_as_null=True)
        out.version = read
        return out


def _open(path: str, version, timestamp, storage_options):
    """The table as of ``version`` or ``timestamp``, or the newest."""
    deltalake = _import_deltalake()
    options = delta_options(path, storage_options)
    uri = delta_uri(path)
    if not deltalake.DeltaTable.is_deltatable(uri, storage_options=options):
        raise DataError(f"No Delta table at {path!r}: it has no _delta_log.")
    table = deltalake.DeltaTable(uri, storage_options=options)
    newest = table.version()
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= newest:
            known = sorted({int(h["version"]) for h in table.history() if "version" in h})
            raise DataError(f"The Delta table at {path!r} has no version {version!r}; it has versions {known}.")
        table.load_as_version(version)
    elif timestamp is not None:
        when = _moment(timestamp)
        commits = {int(h["version"]): int(h["timestamp"]) for h in table.history() if "version" in h}
        first = min(commits.items())
        if when.timestamp() * 1000 < first[1]:
            made = datetime.datetime.fromtimestamp(first[1] / 1000, datetime.timezone.utc).isoformat()
            raise DataError(f"The Delta table at {path!r} has no version as of {timestamp!r}: its first version "
                            f"({first[0]}) was written at {made}.")
        table.load_as_version(when)
    return table


#: Delta's column mapping: the table property, and the schema's field metadata that gives a column's place in the files
_MAPPING_MODE, _PHYSICAL_NAME, _FIELD_ID = ("delta.columnMapping.mode", "delta.columnMapping.physicalName",
                                            "delta.columnMapping.id")


def _stored_columns(table, path: str) -> dict[str, FileColumn]:
    """Where the files hold each column of the table's schema under column mapping (mode ``name``: the physical
    name; mode ``id``: the Parquet field id), read from deltalake's own schema and metadata; empty without it.

    Raises:
        DataError: a column mapping mode that Delta does not define.
    """
    mode = (table.metadata().configuration or {}).get(_MAPPING_MODE, "none")
    if mode == "none":
        return {}
    if mode not in ("name", "id"):
        raise DataError(f"The Delta table at {path!r} has column mapping mode {mode!r}; Delta defines 'none', 'name' "
                        "and 'id'.")
    out = {}
    for field in table.schema().fields:
        meta = field.metadata or {}
        if _PHYSICAL_NAME in meta:
            out[field.name] = FileColumn(str(meta[_PHYSICAL_NAME]), int(meta[_FIELD_ID]) if mode == "id" else None)
    return out


def _moment(timestamp) -> datetime.datetime:
    """``timestamp`` (a ``datetime``, naive ones in UTC, or an ISO 8601 string) as an aware ``datetime``."""
    if isinstance(timestamp, str):
        try:
            timestamp = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"`timestamp` must be a datetime or an ISO 8601 string. Received: {timestamp!r}") from None
    if not isinstance(timestamp, datetime.datetime):
        raise TypeError(f"`timestamp` must be a datetime or an ISO 8601 string. Received: {timestamp!r}")
    return timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=datetime.timezone.utc)


def _has_deletion_vectors(table) -> bool:
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True))
    return any(name.startswith("deletionVector") for name in actions.column_names) and any(
        v is not None for name in actions.column_names if name.startswith("deletionVector")
        for v in actions.column(name).to_pylist())


def _in_filesystem(uri: str) -> str:
    """A file's path as the reading file system names it: ``bucket/key`` for ``s3://bucket/key``, a local path
    as it is."""
    if storage.is_remote(uri):
        from fsspec.core import split_protocol

        return split_protocol(uri)[1]
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _typed(value, kind):
    """A partition value (Delta's log keeps them as text) as its column's type."""
    import pyarrow as pa

    if value is None:
        return None
    return pa.array([value]).cast(kind)[0].as_py()
