"""The state server's socket protocol (``transformWithStateInPandas``): a Spark internal,
listed with the others in ``_spark_internals.py`` (which re-exports :class:`MapStatePipeline`)
and checked by ``tests/runtime/test_spark_internals.py``."""

from __future__ import annotations

from typing import Any

# ---- the state server's socket protocol (transformWithStateInPandas) -------------------------
#: a chunk of read requests stays under this many bytes: the server may block writing
#: answers until they are read, and the requests still unsent must fit in socket buffers
_READ_CHUNK_BYTES = 48 * 1024
#: write answers are a few bytes each, so the server never blocks on them
_WRITE_CHUNK = 2_000


class MapStatePipeline:
    """MapState reads and writes for many user keys, a chunk of requests per round trip."""

    def __init__(self, map_state: Any) -> None:
        import pyspark.sql.streaming.proto.StateMessage_pb2 as msg

        client = map_state._mapStateClient
        self.api = client._stateful_processor_api_client
        self.name = map_state._stateName
        self.key_schema = client.user_key_schema
        self.value_schema = client.value_schema
        self.msg = msg

    def _request(self, call: Any) -> bytes:
        msg = self.msg
        return msg.StateRequest(
            stateVariableRequest=msg.StateVariableRequest(mapStateCall=call)
        ).SerializeToString()

    def _send(self, requests: list[bytes]) -> None:
        f = self.api.sockfile
        for r in requests:
            f.write(b"\x00\x00\x00\x00" + len(r).to_bytes(4, "big"))  # version 0, length
            f.write(r)
        f.flush()

    def _answers(self, n: int, what: str) -> list[bytes]:
        out = []
        for _ in range(n):
            status, error, value = self.api._receive_proto_message()
            if status != 0:
                msg = f"state server: {what} failed: {error}"
                raise RuntimeError(msg)
            out.append(value)
        return out

    def get_many(self, keys: list[bytes]) -> dict[bytes, bytes | None]:
        """Each key's value (``None``: absent)."""
        msg, ser = self.msg, self.api._serialize_to_bytes
        out: dict[bytes, bytes | None] = {}
        i = 0
        while i < len(keys):
            chunk: list[bytes] = []
            size = 0
            while i < len(keys) and (not chunk or size < _READ_CHUNK_BYTES):
                r = self._request(
                    msg.MapStateCall(
                        stateName=self.name,
                        getValue=msg.GetValue(userKey=ser(self.key_schema, (keys[i],))),
                    )
                )
                chunk.append(r)
                size += len(r) + 8
                i += 1
            self._send(chunk)
            start = i - len(chunk)
            for k, value in zip(keys[start:i], self._answers(len(chunk), "getValue"), strict=True):
                out[k] = self.api._deserialize_from_bytes(value)[0] if value else None
        return out

    def write_many(self, updates: list[tuple[bytes, bytes]], removals: list[bytes]) -> None:
        msg, ser = self.msg, self.api._serialize_to_bytes
        requests = [
            self._request(
                msg.MapStateCall(
                    stateName=self.name,
                    updateValue=msg.UpdateValue(
                        userKey=ser(self.key_schema, (k,)), value=ser(self.value_schema, (v,))
                    ),
                )
            )
            for k, v in updates
        ] + [
            self._request(
                msg.MapStateCall(
                    stateName=self.name, removeKey=msg.RemoveKey(userKey=ser(self.key_schema, (k,)))
                )
            )
            for k in removals
        ]
        for start in range(0, len(requests), _WRITE_CHUNK):
            chunk = requests[start : start + _WRITE_CHUNK]
            self._send(chunk)
            self._answers(len(chunk), "updateValue/removeKey")
