"""The replicated backend: etcd (Raft) through its v3 JSON gateway (``/v3/kv/txn``) over httpx.

Photon's IdRegistry stands on PaxosDB (§2.1); here etcd plays that part. Every decision is
made **by etcd**, inside a transaction, so any number of registry servers may share one
cluster and the registry itself keeps no state that matters:

* a conditional commit of one id is a nested transaction
  ``if create_revision(e/<shard>/<id>) == 0 then put entry, put time index else get entry``;
  a call sends many of them in one outer transaction that also compares the metadata key's
  ``mod_revision`` with the one this server read (so a GC boundary or a shard configuration
  set by another server is never ignored), and several such transactions in parallel.
  etcd limits the operations of a transaction (``--max-txn-ops``, 128 by default, nested
  operations included), so a call is cut into chunks of ``max_txn_ops - 2`` ids;
* a new shard configuration is written only if no time-index key at or after its start
  exists (a compare over a key *range*), in the same transaction as the metadata compare;
* keys and values travel base64-encoded; every key is under ``prefix``.

A request that fails on a connection error, a timeout or a 5xx (a leader election) is sent
again, to the next endpoint, until ``timeout`` seconds have passed. That is safe even when
the first attempt was applied: a repeated commit finds its own token (``COMMITTED``), a
repeated metadata change finds the metadata changed and is re-read, a repeated delete finds
nothing to delete.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from id_registry._backend import Backend, MetaChangedError, Replace, reshard_refused
from id_registry._errors import BackendUnavailableError, InvalidRequestError
from id_registry._model import (
    INDEX_END,
    INDEX_PREFIX,
    META_KEY,
    Meta,
    entry_of_index,
    index_time_key,
)
from servicekit import describe

#: etcd's default limit on the operations of one transaction
DEFAULT_MAX_TXN_OPS = 128
DEFAULT_PREFIX = "millwheel/id_registry/"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _public(url: str) -> str:
    """``url`` without any user name or password in it (for the status page)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def _chunks(seq: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


class EtcdBackend(Backend):
    """The registry's entries in an etcd cluster (see the module docstring).

    * ``endpoints`` — client URLs of the members, e.g. ``["http://127.0.0.1:2379", ...]``;
      requests go to one and move to the next when it fails;
    * ``prefix`` — every key is under it (several registries may share a cluster);
    * ``max_txn_ops`` — the cluster's ``--max-txn-ops`` (ids per transaction: this minus 2);
    * ``parallel`` — transactions of one call in flight at once;
    * ``timeout`` — seconds a request may keep failing over before :class:`BackendUnavailableError`;
    * ``attempt_timeout`` — seconds for one attempt.
    """

    kind = "etcd"

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = DEFAULT_PREFIX,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        parallel: int = 8,
        timeout: float = 30.0,
        attempt_timeout: float = 5.0,
        transport: Any = None,
    ) -> None:
        import httpx

        super().__init__()
        if not endpoints:
            msg = "EtcdBackend needs at least one endpoint, e.g. http://127.0.0.1:2379"
            raise InvalidRequestError(msg)
        if max_txn_ops < 4:
            msg = f"max_txn_ops must be at least 4 (etcd's default is {DEFAULT_MAX_TXN_OPS}), got {max_txn_ops}"
            raise InvalidRequestError(msg)
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.prefix = prefix.encode()
        self.max_txn_ops = max_txn_ops
        self.timeout = timeout
        self.txns = 0
        self.failovers = 0
        self._httpx = httpx
        self._client = httpx.Client(
            timeout=attempt_timeout,
            transport=transport,
            limits=httpx.Limits(max_connections=max(parallel, 4) * 2),
        )
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="id-registry-etcd")
        self._current = 0
        self._lock = threading.Lock()
        self._random = random.Random()

    # ------------------------------------------------------------------ transport
    def _key(self, key: bytes) -> str:
        return _b64(self.prefix + key)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the current member, failing over to the next until ``timeout``."""
        httpx = self._httpx
        deadline = time.monotonic() + self.timeout
        last = ""
        attempt = 0
        while True:
            with self._lock:
                index = self._current
            endpoint = self.endpoints[index]
            try:
                response = self._client.post(endpoint + path, json=body)
                if response.status_code == 200:
                    return response.json()  # type: ignore[no-any-return]
                last = (
                    f"HTTP {response.status_code} from {endpoint}: {describe(response.text, 300)}"
                )
                if response.status_code < 500 and "leader" not in response.text:
                    hint = ""
                    if "too many operations" in response.text:
                        hint = f"; this registry sends up to {self.max_txn_ops} operations per transaction: give it the cluster's --max-txn-ops (--etcd-max-txn-ops)"
                    msg = f"etcd refused {path}: {last}{hint}"
                    raise BackendUnavailableError(msg)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__} from {endpoint}: {exc}"
            attempt += 1
            with self._lock:
                if self._current == index:
                    self._current = (index + 1) % len(self.endpoints)
                    self.failovers += 1
            if time.monotonic() >= deadline:
                msg = f"etcd did not answer {path} within {self.timeout:g}s at any of {self.endpoints} (last: {last}); is a majority of its members up?"
                raise BackendUnavailableError(msg)
            if attempt >= len(self.endpoints):  # every member tried: wait for an election
                time.sleep(
                    min(0.5, 0.02 * 2 ** min(attempt, 5)) * (0.5 + self._random.random() / 2)
                )

    def _txn(self, body: dict[str, Any]) -> dict[str, Any]:
        out = self._post("/v3/kv/txn", body)
        self.txns += 1
        return out

    def _meta_compare(self, meta: Meta | None) -> dict[str, Any]:
        if meta is None:
            return {
                "key": self._key(META_KEY),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": "0",
            }
        return {
            "key": self._key(META_KEY),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(meta.revision),
        }

    def _parallel(self, fn: Any, chunks: list[Sequence[Any]]) -> list[Any]:
        if len(chunks) == 1:
            return [fn(chunks[0])]
        return list(self._pool.map(fn, chunks))

    # ------------------------------------------------------------------ the interface
    def read_meta(self) -> Meta | None:
        out = self._post("/v3/kv/range", {"key": self._key(META_KEY)})
        kvs = out.get("kvs") or []
        if not kvs:
            return None
        return Meta.decode(_unb64(kvs[0]["value"]), int(kvs[0]["mod_revision"]))

    def write_meta(
        self, meta: Meta, *, expected: Meta | None, no_entries_from: int | None = None
    ) -> Meta:
        compare = [self._meta_compare(expected)]
        if no_entries_from is not None:
            compare.append(
                {
                    "key": self._key(index_time_key(no_entries_from)),
                    "range_end": self._key(INDEX_END),
                    "target": "CREATE",
                    "result": "EQUAL",
                    "create_revision": "0",
                }
            )
        body = {
            "compare": compare,
            "success": [
                {"request_put": {"key": self._key(META_KEY), "value": _b64(meta.encode())}}
            ],
            "failure": [{"request_range": {"key": self._key(META_KEY)}}],
        }
        out = self._txn(body)
        if out.get("succeeded"):
            self.writes += 1
            return Meta(meta.gc_boundary_ms, meta.shards, int(out["header"]["revision"]))
        kvs = out["responses"][0]["response_range"].get("kvs") or []
        stored = int(kvs[0]["mod_revision"]) if kvs else 0
        if no_entries_from is None or stored != (expected.revision if expected is not None else 0):
            raise MetaChangedError
        latest = self.latest_event_time()
        raise reshard_refused(no_entries_from, latest if latest is not None else no_entries_from)

    def insert_if_absent(
        self,
        keys: Sequence[bytes],
        index_keys: Sequence[bytes],
        values: Sequence[bytes],
        meta: Meta,
    ) -> list[bytes | None]:
        compare = [self._meta_compare(meta)]
        entries = list(zip(keys, index_keys, values, strict=True))

        def chunk(part: Sequence[tuple[bytes, bytes, bytes]]) -> list[bytes | None]:
            ops = []
            for key, index, value in part:
                k = self._key(key)
                ops.append(
                    {
                        "request_txn": {
                            "compare": [
                                {
                                    "key": k,
                                    "target": "CREATE",
                                    "result": "EQUAL",
                                    "create_revision": "0",
                                }
                            ],
                            "success": [
                                {"request_put": {"key": k, "value": _b64(value)}},
                                {"request_put": {"key": self._key(index), "value": ""}},
                            ],
                            "failure": [{"request_range": {"key": k}}],
                        }
                    }
                )
            out = self._txn({"compare": compare, "success": ops})
            if not out.get("succeeded"):
                raise MetaChangedError
            self.writes += 1
            answers: list[bytes | None] = []
            for response in out["responses"]:
                inner = response["response_txn"]
                if inner.get("succeeded"):
                    answers.append(None)
                else:
                    kvs = inner["responses"][0]["response_range"].get("kvs") or []
                    answers.append(_unb64(kvs[0]["value"]) if kvs else None)
            return answers

        parts = self._parallel(chunk, _chunks(entries, self.max_txn_ops - 2))
        return [answer for part in parts for answer in part]

    def get_many(self, keys: Sequence[bytes], meta: Meta) -> list[bytes | None]:
        compare = [self._meta_compare(meta)]

        def chunk(part: Sequence[bytes]) -> list[bytes | None]:
            out = self._txn(
                {
                    "compare": compare,
                    "success": [{"request_range": {"key": self._key(k)}} for k in part],
                }
            )
            if not out.get("succeeded"):
                raise MetaChangedError
            values: list[bytes | None] = []
            for response in out.get("responses", []):
                kvs = response["response_range"].get("kvs") or []
                values.append(_unb64(kvs[0]["value"]) if kvs else None)
            return values

        parts = self._parallel(chunk, _chunks(keys, self.max_txn_ops - 1))
        return [value for part in parts for value in part]

    def replace_if(self, ops: Sequence[Replace], meta: Meta) -> list[bool]:
        compare = [self._meta_compare(meta)]

        def chunk(part: Sequence[Replace]) -> list[bool]:
            txns = []
            for key, index, expected, new in part:
                k = self._key(key)
                then = (
                    [
                        {"request_delete_range": {"key": k}},
                        {"request_delete_range": {"key": self._key(index)}},
                    ]
                    if new is None
                    else [{"request_put": {"key": k, "value": _b64(new)}}]
                )
                txns.append(
                    {
                        "request_txn": {
                            "compare": [
                                {
                                    "key": k,
                                    "target": "VALUE",
                                    "result": "EQUAL",
                                    "value": _b64(expected),
                                }
                            ],
                            "success": then,
                        }
                    }
                )
            out = self._txn({"compare": compare, "success": txns})
            if not out.get("succeeded"):
                raise MetaChangedError
            self.writes += 1
            return [bool(r["response_txn"].get("succeeded")) for r in out["responses"]]

        parts = self._parallel(chunk, _chunks(ops, self.max_txn_ops - 2))
        return [done for part in parts for done in part]

    def index_below(self, boundary_ms: int, limit: int) -> list[bytes]:
        body = {
            "key": self._key(INDEX_PREFIX),
            "range_end": self._key(index_time_key(boundary_ms)),
            "limit": str(limit),
            "keys_only": True,
        }
        out = self._post("/v3/kv/range", body)
        n = len(self.prefix)
        return [_unb64(kv["key"])[n:] for kv in out.get("kvs") or []]

    def delete_indexed(self, index_keys: Sequence[bytes]) -> int:
        def chunk(part: Sequence[bytes]) -> int:
            ops = []
            for index in part:
                ops.append({"request_delete_range": {"key": self._key(entry_of_index(index)[0])}})
                ops.append({"request_delete_range": {"key": self._key(index)}})
            self._txn({"success": ops})
            self.writes += 1
            return len(part)

        if not index_keys:
            return 0
        return sum(self._parallel(chunk, _chunks(index_keys, self.max_txn_ops // 2)))

    def latest_event_time(self) -> int | None:
        body = {
            "key": self._key(INDEX_PREFIX),
            "range_end": self._key(INDEX_END),
            "limit": "1",
            "sort_order": "DESCEND",
            "sort_target": "KEY",
            "keys_only": True,
        }
        kvs = self._post("/v3/kv/range", body).get("kvs") or []
        if not kvs:
            return None
        return entry_of_index(_unb64(kvs[0]["key"])[len(self.prefix) :])[1]

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(
            endpoints=[_public(e) for e in self.endpoints],
            txns=self.txns,
            failovers=self.failovers,
            max_txn_ops=self.max_txn_ops,
        )
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
