"""Device sets that cost O(1) per message: the maintained online view, the lazy set."""

from __future__ import annotations

from ursa.coordinator.device_sets import (
    CHANGE_LOG,
    IndexedDevices,
    LazyDevices,
    OnlineDevices,
)


def view(ready: set[str], sat_out: dict[str, int], epoch: int = 1) -> OnlineDevices:
    return OnlineDevices(ready, lambda: sat_out, lambda: epoch)


def test_the_view_follows_its_set_without_the_devices_sitting_out() -> None:
    ready, sat_out = {"a", "b", "c"}, {"b": 1, "c": 0}  # c sat out an older epoch
    online = view(ready, sat_out)
    assert set(online) == {"a", "c"} and len(online) == 2
    assert "b" not in online and "a" in online and 3 not in online
    ready.discard("a")  # a live view, not a copy
    assert set(online) == {"c"} and len(online) == 1


def test_operators_give_frozensets_and_iterate_the_other_side() -> None:
    online = view({f"d{i}" for i in range(1000)}, {})
    members = {"d1", "d2", "x"}
    assert members & online == frozenset({"d1", "d2"})
    assert isinstance(members & online, frozenset)
    assert frozenset(members) - online == frozenset({"x"})
    assert online == {f"d{i}" for i in range(1000)}


def test_changes_since_lists_the_touched_devices_or_asks_for_a_rescan() -> None:
    online = view(set(), {})
    assert online.changes_since(None) == (0, None)
    online.touch("a")
    online.touch("b")
    mark, changed = online.changes_since(0)
    assert (mark, changed) == (2, ["a", "b"])
    assert online.changes_since(mark) == (2, [])
    for i in range(CHANGE_LOG + 1):
        online.touch(f"d{i}")
    assert online.changes_since(mark)[1] is None  # the log lost some: rescan
    now = online.version
    online.forget()
    assert online.changes_since(now)[1] is None


def test_a_lazy_set_is_built_once_on_first_use() -> None:
    calls: list[int] = []

    def build() -> set[str]:
        calls.append(1)
        return {"a", "b"}

    lazy = LazyDevices(build)
    assert not lazy.is_built and calls == []
    assert "a" in lazy and len(lazy) == 2 and sorted(lazy) == ["a", "b"]
    assert lazy.is_built and calls == [1]


def test_indexed_devices_swap_remove_keeps_every_position_a_member() -> None:
    devices = IndexedDevices(["a", "b", "c", "d"])
    devices.add("b")  # already there: no-op
    devices.discard("b")  # "d" takes its position
    devices.discard("x")  # absent: no-op
    devices.discard("d")  # now the last: popped
    devices.add("e")
    assert len(devices) == 3 and set(devices) == {"a", "c", "e"}
    assert {devices.at(i) for i in range(len(devices))} == {"a", "c", "e"}
    assert [devices.at(i) for i in range(3)] == ["a", "c", "e"]
    assert "b" not in devices and "e" in devices and 3 not in devices
    assert devices & {"a", "z"} == frozenset({"a"})
