"""The cache stores' contract, stamped out for memory, disk and Redis, plus each one's own corners.

Redis tests use the session's real redis-server (``redis_url``), each store with its own prefix.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from llmroute._redis import redact_url
from llmroute.cache._admission import PopularityCounter
from llmroute.cache._redis import RedisStore
from llmroute.cache._stores import (
    CacheStore,
    CacheUnavailable,
    DiskStore,
    MemoryStore,
    StoreStats,
)

from ..clock import FakeClock

MAX_BYTES = 1 << 20
StoreFactory = Callable[..., CacheStore]


def key(n: int, namespace: str = "chat") -> str:
    return f"{namespace}/{n:064x}"


@pytest.fixture(params=["memory", "disk", "redis"])
async def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[StoreFactory]:
    """Makes stores of one kind, each with its own directory or prefix; clears them afterwards."""
    kind: str = request.param
    url: str = request.getfixturevalue("redis_url") if kind == "redis" else ""
    made: list[CacheStore] = []

    def make(max_bytes: int = MAX_BYTES) -> CacheStore:
        store: CacheStore
        if kind == "memory":
            store = MemoryStore(max_bytes)
        elif kind == "disk":
            store = DiskStore(tmp_path / f"cache{len(made)}", max_bytes)
        else:
            store = RedisStore(url, prefix=f"test-{uuid.uuid4().hex}")
        made.append(store)
        return store

    yield make
    for store in made:
        await store.clear()
        await store.aclose()


@pytest.fixture
async def store(make_store: StoreFactory) -> CacheStore:
    return make_store()


# -- the contract ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_round_trip_of_any_bytes(store: CacheStore) -> None:
    values = [b"", b"\x00\xff\xfe\x80 not utf-8", '{"é": "ü"}'.encode(), os.urandom(100_000)]
    for n, value in enumerate(values):
        await store.set(key(n), value, ttl=60)
    assert [await store.get(key(n)) for n in range(len(values))] == values


@pytest.mark.anyio
async def test_missing_key_is_none(store: CacheStore) -> None:
    assert await store.get(key(1)) is None
    await store.delete(key(1))  # deleting nothing is fine


@pytest.mark.anyio
async def test_overwrite_and_delete(store: CacheStore) -> None:
    await store.set(key(1), b"first", ttl=60)
    await store.set(key(1), b"second", ttl=60)
    await store.set(key(2), b"other", ttl=60)
    assert await store.get(key(1)) == b"second"
    await store.delete(key(1))
    assert await store.get(key(1)) is None
    assert await store.get(key(2)) == b"other"
    assert (await store.stats()).entries == 1


@pytest.mark.anyio
async def test_entries_expire_after_their_ttl(store: CacheStore) -> None:
    await store.set(key(1), b"short", ttl=0.3)
    await store.set(key(2), b"long", ttl=60)
    for _ in range(60):  # 60 polls 50 ms apart: at least 3 s, however loaded the machine
        if await store.get(key(1)) is None:
            break
        await anyio.sleep(0.05)
    else:
        pytest.fail("the entry outlived its 0.3 s TTL by 3 s")
    # Still there after the short one expired: a TTL is in seconds, whatever the store.
    assert await store.get(key(2)) == b"long"
    assert (await store.stats()).entries == 1


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), float("nan")])
@pytest.mark.anyio
async def test_ttl_must_be_positive_and_finite(store: CacheStore, ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.set(key(1), b"x", ttl=ttl)


@pytest.mark.anyio
async def test_popularity_counts_within_a_window_then_restarts(store: CacheStore) -> None:
    assert [await store.hit(key(1), window=60) for _ in range(3)] == [1, 2, 3]
    assert await store.hit(key(2), window=60) == 1  # keys count apart
    assert await store.hit(key(3), window=0.5) == 1
    await anyio.sleep(0.6)  # a loaded machine only sleeps longer: the window has passed
    assert await store.hit(key(3), window=0.5) == 1
    assert await store.hit(key(3), window=30) == 2


@pytest.mark.anyio
async def test_stats_count_entries_bytes_and_lookups(store: CacheStore) -> None:
    empty = await store.stats()
    assert empty == StoreStats(entries=0, bytes=0, hits=0, misses=0)
    assert empty.hit_rate is None
    await store.set(key(1), b"abc", ttl=60)
    await store.set(key(2), b"defgh", ttl=60)
    await store.hit(key(1), window=60)
    await store.add_stats(hits=2, misses=1)
    await store.add_stats(hits=1, misses=0)
    stats = await store.stats()
    assert stats == StoreStats(entries=2, bytes=8, hits=3, misses=1)
    assert stats.hit_rate == 0.75


@pytest.mark.anyio
async def test_clear_removes_entries_counts_and_stats(store: CacheStore) -> None:
    for n in range(3):
        await store.set(key(n), b"value", ttl=60)
    await store.hit(key(0), window=60)
    await store.hit(key(0), window=60)
    await store.add_stats(hits=5, misses=2)
    assert await store.clear() == 3
    assert [await store.get(key(n)) for n in range(3)] == [None] * 3
    assert await store.stats() == StoreStats(entries=0, bytes=0, hits=0, misses=0)
    assert await store.hit(key(0), window=60) == 1
    assert await store.clear() == 0


@pytest.mark.anyio
async def test_stores_are_isolated(make_store: StoreFactory) -> None:
    first, second = make_store(), make_store()
    await first.set(key(1), b"first", ttl=60)
    await first.hit(key(1), window=60)
    await first.add_stats(hits=1, misses=0)
    await second.set(key(2), b"second", ttl=60)
    assert await second.get(key(1)) is None
    assert await second.hit(key(1), window=60) == 1
    assert await first.clear() == 1
    assert await second.get(key(2)) == b"second"
    assert await second.stats() == StoreStats(entries=1, bytes=6, hits=0, misses=0)


@pytest.mark.anyio
async def test_keys_of_several_namespaces(store: CacheStore) -> None:
    namespaces = ["chat", "embed.v2", "A-b_c", "n" * 64]
    for namespace in namespaces:
        await store.set(key(7, namespace), namespace.encode(), ttl=60)
    for namespace in namespaces:
        assert await store.get(key(7, namespace)) == namespace.encode()
    assert (await store.stats()).entries == len(namespaces)


@pytest.mark.anyio
async def test_concurrent_use(store: CacheStore) -> None:
    async def one(n: int) -> None:
        await store.set(key(n), str(n).encode(), ttl=60)
        assert await store.get(key(n)) == str(n).encode()
        await store.hit(key(0), window=60)
        await store.add_stats(hits=1, misses=1)

    async with anyio.create_task_group() as tasks:
        for n in range(50):
            tasks.start_soon(one, n)
    assert await store.stats() == StoreStats(entries=50, bytes=90, hits=50, misses=50)
    assert await store.hit(key(0), window=60) == 51


@pytest.mark.anyio
async def test_size_is_bounded(make_store: StoreFactory) -> None:
    max_bytes = 512 * 1024
    store = make_store(max_bytes)
    if store.kind == "redis":
        pytest.skip("Redis bounds its memory on the server (maxmemory + eviction), not here")
    value = os.urandom(4096)
    hot = [key(0), key(1)]
    for n in range(3 * max_bytes // len(value)):
        await store.set(key(n), value, ttl=60)
        if n % 8 == 7:
            assert [await store.get(k) for k in hot] == [value, value]
    stats = await store.stats()
    assert max_bytes // 8 <= stats.bytes <= max_bytes
    assert [await store.get(k) for k in hot] == [value, value]
    assert await store.get(key(2)) is None  # old and never read
    await store.set(key(0), os.urandom(max_bytes + 1), ttl=60)  # too large: not stored
    assert await store.get(key(0)) is None


# -- PopularityCounter ------------------------------------------------------------------------


def test_popularity_counter_fixed_window() -> None:
    clock = FakeClock()
    counter = PopularityCounter(clock=clock)
    assert [counter.hit("a", 10) for _ in range(3)] == [1, 2, 3]
    clock.advance(9.9)
    assert counter.hit("a", 10) == 4  # the window started at the first ask, not the last
    clock.advance(0.1)
    assert counter.hit("a", 10) == 1
    assert counter.hit("b", 10) == 1
    assert len(counter) == 2


def test_popularity_counter_forgets_the_least_recently_asked_key() -> None:
    counter = PopularityCounter(max_keys=3, clock=FakeClock())
    for name in ["a", "b", "c", "a", "d"]:  # "b" is the least recently asked when "d" arrives
        counter.hit(name, 60)
    assert len(counter) == 3
    assert counter.hit("a", 60) == 3
    assert counter.hit("b", 60) == 1
    assert counter.hit("d", 60) == 2
    counter.clear()
    assert len(counter) == 0


def test_popularity_counter_memory_stays_bounded() -> None:
    counter = PopularityCounter(max_keys=100, clock=FakeClock())
    for n in range(1000):
        counter.hit(key(n), 60)
    assert len(counter) == 100
    assert counter.hit(key(999), 60) == 2
    assert counter.hit(key(0), 60) == 1


# -- MemoryStore ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_memory_evicts_least_recently_used_by_bytes() -> None:
    store = MemoryStore(max_bytes=10)
    await store.set("a", b"aaaa", ttl=60)
    await store.set("b", b"bbbb", ttl=60)
    assert await store.get("a") == b"aaaa"  # now "b" is the least recent
    await store.set("c", b"cccc", ttl=60)
    assert [await store.get(k) for k in "abc"] == [b"aaaa", None, b"cccc"]
    await store.set("d", b"dddddd", ttl=60)  # "a" was read before "c": "a" goes
    assert [await store.get(k) for k in "acd"] == [None, b"cccc", b"dddddd"]
    assert await store.stats() == StoreStats(entries=2, bytes=10, hits=0, misses=0)
    await store.set("c", b"x" * 11, ttl=60)  # too large: not stored, and the old value is gone
    assert await store.get("c") is None
    assert (await store.stats()).bytes == 6


@pytest.mark.anyio
async def test_memory_ttl_on_its_clock() -> None:
    clock = FakeClock()
    store = MemoryStore(max_bytes=100, clock=clock)
    await store.set("a", b"1", ttl=10)
    await store.set("b", b"22", ttl=20)
    clock.advance(9.9)
    assert await store.get("a") == b"1"
    clock.advance(0.1)
    assert await store.get("a") is None
    assert await store.stats() == StoreStats(entries=1, bytes=2, hits=0, misses=0)
    clock.advance(10)
    assert await store.stats() == StoreStats(entries=0, bytes=0, hits=0, misses=0)
    assert [await store.hit("p", window=5) for _ in range(2)] == [1, 2]
    clock.advance(5)
    assert await store.hit("p", window=5) == 1


# -- DiskStore --------------------------------------------------------------------------------


def _modes(path: Path) -> dict[str, int]:
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = Path(root, name)
            found[str(full.relative_to(path))] = stat.S_IMODE(full.stat().st_mode)
    return found


@pytest.mark.anyio
async def test_disk_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "cache"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    store = DiskStore(path, MAX_BYTES)
    for n in range(50):
        await store.set(key(n), os.urandom(50_000), ttl=60)
        await store.add_stats(hits=1, misses=1)
    assert await store.get(key(49)) is not None
    modes = _modes(path)
    await store.aclose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert {"cache.db", "cache.db-wal", "cache.db-shm"} <= set(modes)
    assert {name: mode for name, mode in modes.items() if mode & 0o077} == {}


@pytest.mark.anyio
async def test_disk_makes_a_private_directory(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    store = DiskStore(path, MAX_BYTES)
    await store.set(key(1), b"x", ttl=60)
    await store.aclose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


@pytest.mark.anyio
async def test_disk_unusable_path_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"not a directory")
    with pytest.raises(CacheUnavailable, match="disk at"):
        DiskStore(path, MAX_BYTES)


def _open_files(path: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, or one closed since
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists open files with /proc")
@pytest.mark.anyio
async def test_disk_aclose_releases_its_files(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, MAX_BYTES)
    await store.set(key(1), b"x", ttl=60)
    async with anyio.create_task_group() as tasks:
        for _ in range(20):  # many worker threads, still one connection
            tasks.start_soon(store.get, key(1))
    assert len(_open_files(tmp_path)) <= 3  # cache.db, -wal, -shm
    await store.aclose()
    assert _open_files(tmp_path) == []
    assert await store.get(key(1)) == b"x"  # used again, it opens again
    await store.aclose()


@pytest.mark.anyio
async def test_disk_popularity_is_shared_by_the_stores_of_one_directory(tmp_path: Path) -> None:
    first, second = DiskStore(tmp_path / "a", MAX_BYTES), DiskStore(tmp_path / "a", MAX_BYTES)
    other = DiskStore(tmp_path / "b", MAX_BYTES)
    assert await first.hit(key(1), window=60) == 1
    assert await second.hit(key(1), window=60) == 2
    assert await other.hit(key(1), window=60) == 1
    for store in (first, second, other):
        await store.aclose()


WRITER = """
import sys, anyio
from llmroute.cache._stores import DiskStore

async def main() -> None:
    store = DiskStore(sys.argv[1], max_bytes=1 << 20)
    print((await store.get(sys.argv[2])).decode())
    await store.set(sys.argv[3], b"from the child", ttl=60)
    await store.add_stats(hits=2, misses=1)
    await store.aclose()

anyio.run(main)
"""


@pytest.mark.anyio
async def test_disk_is_shared_across_processes(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, MAX_BYTES)
    await store.set(key(1), b"from the parent", ttl=60)
    await store.add_stats(hits=1, misses=0)
    with anyio.fail_after(60):
        child = await anyio.run_process(
            [sys.executable, "-c", WRITER, str(tmp_path), key(1), key(2)],
            cwd=Path(__file__).parents[2],
        )
    assert child.stdout.decode().strip() == "from the parent"
    assert await store.get(key(2)) == b"from the child"
    assert await store.stats() == StoreStats(entries=2, bytes=29, hits=3, misses=1)
    await store.aclose()


# -- RedisStore -------------------------------------------------------------------------------


def test_redact_url() -> None:
    assert redact_url("redis://:hunter2@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("rediss://me:hunter2@host/1") == "rediss://me:***@host/1"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert redact_url("redis://me@host") == "redis://me@host"
    assert "hunter2" not in redact_url("redis://host/0?password=hunter2&db=1")


@pytest.mark.parametrize(
    "template",
    ["redis://:hunter2@127.0.0.1:{port}/0", "redis://127.0.0.1:{port}/0?password=hunter2"],
)
@pytest.mark.anyio
async def test_redis_unreachable_is_unavailable_quickly(template: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = RedisStore(template.format(port=port), prefix="down")
    assert "hunter2" not in store.describe()
    assert f"127.0.0.1:{port}" in store.describe()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.get(key(1)),
        lambda: store.set(key(1), b"x", ttl=60),
        lambda: store.delete(key(1)),
        lambda: store.hit(key(1), window=60),
        lambda: store.add_stats(hits=1, misses=0),
        store.stats,
        store.clear,
    ]
    for call in calls:
        with anyio.fail_after(5), pytest.raises(CacheUnavailable) as caught:
            await call()
        assert "hunter2" not in str(caught.value)
        assert "***" in str(caught.value)
    await store.aclose()


def test_redis_prefix_must_be_plain() -> None:
    for prefix in ["", "a:b", "a*", "x" * 65]:
        with pytest.raises(ValueError, match="prefix"):
            RedisStore("redis://127.0.0.1:1/0", prefix=prefix)


@pytest.mark.anyio
async def test_redis_key_layout_and_native_ttls(redis_url: str) -> None:
    import redis

    prefix = f"test-{uuid.uuid4().hex}"
    store = RedisStore(redis_url, prefix=prefix)
    raw = redis.Redis.from_url(redis_url)
    try:
        await store.set(key(1), b"value", ttl=60)
        await store.hit(key(1), window=30)
        assert await store.hit(key(1), window=30) == 2
        await store.add_stats(hits=1, misses=2)
        assert raw.get(f"{prefix}:e:{key(1)}") == b"value"
        assert 0 < int(raw.pttl(f"{prefix}:e:{key(1)}")) <= 60_000  # type: ignore[arg-type]
        assert 0 < int(raw.pttl(f"{prefix}:p:{key(1)}")) <= 30_000  # type: ignore[arg-type]
        assert raw.hgetall(f"{prefix}:cache-stats") == {b"hits": b"1", b"misses": b"2"}
        await store.clear()
        assert list(raw.scan_iter(f"{prefix}:*")) == []
    finally:
        raw.close()
        await store.aclose()


@pytest.mark.anyio
async def test_a_disk_lookup_is_read_without_a_worker_thread_and_keeps_the_lru_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup is one SELECT on the calling thread (a hit, an absent or an expired entry);
    the access time of a hit is written by the worker before its next call (the LRU order
    diskcache evicts by); a connection a worker holds is never waited for."""
    from llmroute.cache import _stores

    store = DiskStore(tmp_path / "cache", MAX_BYTES)
    await store.set(key(1), b"answer", ttl=60)
    await store.set(key(2), b"gone", ttl=60)
    threads = {"n": 0}
    real = _stores.anyio.to_thread.run_sync

    async def counting(*args: object, **kwargs: object) -> object:
        threads["n"] += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_stores.anyio.to_thread, "run_sync", counting)
    sql = store._cache._sql  # pyright: ignore[reportPrivateUsage]
    sql("UPDATE Cache SET expire_time = 1 WHERE key = ?", (key(2),))
    sql("UPDATE Cache SET access_time = 5 WHERE key = ?", (key(1),))
    for _ in range(3):
        assert await store.get(key(1)) == b"answer"
    assert await store.get(key(2)) is None  # expired
    assert await store.get(key(3)) is None  # absent
    assert threads["n"] == 0
    (accessed,) = sql("SELECT access_time FROM Cache WHERE key = ?", (key(1),)).fetchone()
    assert accessed == 5  # not written on the event loop
    await store.set(key(4), b"next", ttl=60)  # the worker's next call writes it first
    assert threads["n"] == 1
    (accessed,) = sql("SELECT access_time FROM Cache WHERE key = ?", (key(1),)).fetchone()
    assert accessed > 5
    with store._lock:  # pyright: ignore[reportPrivateUsage]  # a worker holds the connection
        assert store._read_now(key(1)) is _stores._UNREAD  # pyright: ignore[reportPrivateUsage]
    await store.aclose()
