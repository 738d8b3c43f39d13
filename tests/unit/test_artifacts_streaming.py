"""The pure rules of artifacts and chunks, and the streaming driver (no database)."""

from __future__ import annotations

import pytest

from queuety.core import artifacts, streaming
from queuety.exceptions import InvalidArtifact


@pytest.mark.parametrize("kind, content, stored", [
    ("json", {"b": [1, 2.5, None], "a": "é"}, '{"b":[1,2.5,null],"a":"é"}'.encode()),
    ("json", "plain", b'"plain"'),
    ("text", "line\n", b"line\n"),
    ("markdown", "# T", b"# T"),
    ("bytes", b"\x00\xff", b"\x00\xff"),
    ("bytes", bytearray(b"ab"), b"ab"),
])
def test_encode_decode__round_trip_per_kind(kind, content, stored):
    encoded = artifacts.encode("k", content, kind, {"m": 1}, limit=100)
    assert (encoded.data, encoded.size, encoded.metadata) == (stored, len(stored), {"m": 1})
    assert artifacts.decode(kind, encoded.data) == (bytes(content) if kind == "bytes"
                                                    else content)
    portable = artifacts.portable(kind, encoded.data)
    assert artifacts.encode("k", artifacts.from_portable(kind, portable), kind,
                            limit=100).data == stored


@pytest.mark.parametrize("key, kind, content, metadata, problem", [
    ("", "json", 1, None, "needs a non-empty key"),
    (None, "json", 1, None, "needs a non-empty key"),
    ("a" * 256, "json", 1, None, "256 characters long; the limit is 255"),
    ("a/b", "json", 1, None, "contains '/'"),
    ("a\nb", "json", 1, None, "control character"),
    ("k", "yaml", 1, None, "has kind 'yaml'"),
    ("k", "json", float("nan"), None, "not JSON"),
    ("k", "json", object(), None, "not JSON"),
    ("k", "text", 3, None, "needs a string"),
    ("k", "bytes", "s", None, "needs bytes"),
    ("k", "json", 1, [], "metadata must be a dict"),
    ("k", "json", 1, {"x": {1, 2}}, "metadata is not JSON"),
])
def test_encode__refuses_with_the_key_run_and_fix(key, kind, content, metadata, problem):
    with pytest.raises(InvalidArtifact, match=problem) as caught:
        artifacts.encode(key, content, kind, metadata, limit=100, run_id=7)
    assert "run 7" in str(caught.value) and not caught.value.too_large


def test_encode__size_limit_counts_stored_bytes():
    assert artifacts.encode("k", "é" * 5, "text", limit=10).size == 10
    with pytest.raises(InvalidArtifact, match="is 12 bytes; the limit is 10") as caught:
        artifacts.encode("k", "é" * 6, "text", limit=10)
    assert caught.value.too_large


def test_from_portable__bytes_need_base64():
    with pytest.raises(InvalidArtifact, match="base64"):
        artifacts.from_portable("bytes", "not base64!")


def test_encode_chunk__json_text_and_limits():
    assert artifacts.encode_chunk("tok\n", limit=10, step="s", run_id=1) == '"tok\\n"'
    assert artifacts.encode_chunk({"i": 1}, limit=10, step="s", run_id=1) == '{"i":1}'
    with pytest.raises(InvalidArtifact, match="Step 's' of run 1 yielded a chunk that is not"):
        artifacts.encode_chunk({1, 2}, limit=10, step="s", run_id=1)
    with pytest.raises(InvalidArtifact, match="which JSON cannot carry"):
        artifacts.encode_chunk(float("inf"), limit=10, step="s", run_id=1)
    with pytest.raises(InvalidArtifact, match="MAX_CHUNK_BYTES") as caught:
        artifacts.encode_chunk("x" * 20, limit=10, step="s", run_id=1)
    assert caught.value.too_large


def test_file_name__keeps_safe_characters_and_adds_the_kind_suffix():
    assert artifacts.file_name(3, "draft.v2", "json") == "run-3-draft.v2.json"
    assert artifacts.file_name(3, 'a "b":c', "bytes") == "run-3-a__b__c"


class Sink:
    """An in-memory sink, as the runtime's stores chunks (earlier attempts' first)."""

    def __init__(self, earlier=()):
        self.earlier = list(earlier)
        self.appended: list = []
        self.finished = 0

    def put_artifact(self, key, content, kind, metadata):
        raise AssertionError("not used")

    def stored_chunks(self):
        return self.earlier

    def append_chunk(self, content):
        self.appended.append(content)

    def finish_stream(self):
        self.finished += 1


def test_consume__stores_each_chunk_then_on_complete_gets_all_of_them():
    sink = Sink(earlier=["a"])

    def produce():
        yield "b"
        yield "c"

    output = streaming.consume(produce(), sink, {"s": 1},
                               lambda chunks, state: {"text": "".join(chunks), **state})
    assert output == {"text": "abc", "s": 1}
    assert sink.appended == ["b", "c"] and sink.finished == 1


def test_consume__without_on_complete_the_generators_return_value_is_the_output():
    def produce():
        yield 1
        return {"done": True}

    assert streaming.consume(produce(), Sink(), {}, None) == {"done": True}


def test_consume__async_generator_and_async_on_complete():
    async def produce():
        for word in ("x", "y"):
            yield word

    async def on_complete(chunks, state):
        return {"words": chunks}

    sink = Sink()
    assert streaming.consume(produce(), sink, {}, on_complete) == {"words": ["x", "y"]}
    assert sink.appended == ["x", "y"]


def test_consume__an_error_keeps_what_was_yielded_and_closes_the_generator():
    closed = []

    def produce():
        try:
            yield "kept"
            raise ConnectionError("dropped")
        finally:
            closed.append(True)

    sink = Sink()
    with pytest.raises(ConnectionError):
        streaming.consume(produce(), sink, {}, None)
    assert sink.appended == ["kept"] and sink.finished == 1 and closed == [True]


def test_consume__a_storage_error_at_the_end_does_not_hide_the_streams_error():
    class Failing(Sink):
        def finish_stream(self):
            raise RuntimeError("database down")

    def produce():
        yield "a"
        raise ValueError("the model failed")

    with pytest.raises(ValueError, match="the model failed"):
        streaming.consume(produce(), Failing(), {}, None)


def test_is_stream():
    def gen():
        yield 1

    async def agen():
        yield 1

    assert streaming.is_stream(gen()) and streaming.is_stream(agen())
    assert not streaming.is_stream([1]) and not streaming.is_stream({"a": 1})
