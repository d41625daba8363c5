import errno
import itertools
import json
import logging
import os
import stat
import time
from pathlib import Path

import pytest

from memprof_otel.dumps.store import ID_RE, DumpInfo, DumpStore, default_dir, is_dump_id, make_id, sanitize_model
from memprof_otel.errors import DumpNotFound, InvalidDumpId, MemprofError
from memprof_otel.errors import ExportError

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def clock_from(start=T0, step=1.0):
    ticks = itertools.count()
    return lambda: start + step * next(ticks)


def tokens():
    ticks = itertools.count()
    return lambda: f"{next(ticks):08x}"


def make_store(tmp_path, max_files=20, max_bytes=1 << 20, **kw):
    kw.setdefault("clock", clock_from())
    kw.setdefault("token", tokens())
    return DumpStore(tmp_path / "dumps", max_files, max_bytes, **kw)


def leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_save_writes_json_with_a_well_formed_id(tmp_path):
    store = make_store(tmp_path)
    info = store.save({"a": [1, 2]}, model="bert base/v1")
    assert info.id == "20231114T221320Z-bert_base_v1-00000000"
    assert ID_RE.fullmatch(info.id)
    assert info.path == tmp_path / "dumps" / f"{info.id}.speedscope.json"
    assert json.loads(info.path.read_bytes()) == {"a": [1, 2]}
    assert (info.kind, info.model, info.created) == ("speedscope", "bert_base_v1", T0)
    assert info.size_bytes == info.path.stat().st_size
    assert store.read(info.id) == info.path.read_bytes()
    assert leftovers(info.path.parent) == []


def test_folder_is_private_and_created_on_first_save(tmp_path):
    store = make_store(tmp_path)
    assert not (tmp_path / "dumps").exists()
    assert store.list() == []
    store.save(b"{}")
    assert stat.S_IMODE((tmp_path / "dumps").stat().st_mode) == 0o700


def test_real_clock_and_token_give_valid_unique_ids(tmp_path):
    store = DumpStore(tmp_path, 100, 1 << 20)
    ids = {store.save(b"{}", kind="timeline", model="m").id for _ in range(20)}
    assert len(ids) == 20 and all(ID_RE.fullmatch(i) for i in ids)
    assert {d.kind for d in store.list()} == {"timeline"}


def test_model_is_sanitized_and_truncated():
    assert sanitize_model("a.b/c d-é_9") == "a_b_c_d-__9"
    assert len(sanitize_model("x" * 100)) == 40
    assert ID_RE.fullmatch(make_id(T0, "../../etc/passwd" * 5, "deadbeef"))
    assert make_id(T0, "", "deadbeef") == "20231114T221320Z--deadbeef"


def test_bad_kind_and_data_are_rejected(tmp_path):
    store = make_store(tmp_path)
    for kind in ("../x", "a.b", "", "UP", "x" * 33):
        with pytest.raises(ValueError):
            store.save(b"{}", kind=kind)
    with pytest.raises(TypeError):
        store.save(["not", "a", "mapping"])
    assert store.list() == []


def test_to_dict(tmp_path):
    info = make_store(tmp_path).save(b"{}", model="m")
    assert info.to_dict("http://h:9464") == {
        "id": info.id, "size_bytes": 2, "created": T0, "kind": "speedscope", "model": "m",
        "url": f"http://h:9464/v1/dumps/{info.id}"}
    assert info.to_dict()["url"] == f"/v1/dumps/{info.id}"
    assert isinstance(info, DumpInfo)


def test_list_is_newest_first_and_ignores_foreign_files(tmp_path):
    store = make_store(tmp_path)
    ids = [store.save(b"{}", model=f"m{i}").id for i in range(3)]
    folder = tmp_path / "dumps"
    (folder / "notes.txt").write_text("x")
    (folder / "20231114T221320Z-m-0000000g.speedscope.json").write_text("{}")  # not hex
    (folder / ".memprof-abc.tmp").write_text("half")
    (folder / "subdir.speedscope.json").mkdir()
    assert [d.id for d in store.list()] == ids[::-1]


def test_list_breaks_time_ties_by_id(tmp_path):
    store = make_store(tmp_path, clock=lambda: T0)
    ids = [store.save(b"{}").id for _ in range(3)]
    assert [d.id for d in store.list()] == sorted(ids, reverse=True)


def test_rotation_by_count_removes_the_oldest(tmp_path):
    store = make_store(tmp_path, max_files=3)
    ids = [store.save(b"{}").id for _ in range(5)]
    assert [d.id for d in store.list()] == ids[:1:-1]
    with pytest.raises(DumpNotFound):
        store.read(ids[0])


def test_rotation_by_bytes_removes_the_oldest(tmp_path):
    store = make_store(tmp_path, max_bytes=250)
    ids = [store.save(b"x" * 100).id for _ in range(4)]
    assert [d.id for d in store.list()] == [ids[3], ids[2]]
    assert sum(d.size_bytes for d in store.list()) <= 250


def test_rotation_uses_mtime_not_save_order(tmp_path):
    store = make_store(tmp_path, max_files=2)
    a = store.save(b"{}")
    b = store.save(b"{}")
    os.utime(b.path, (T0 - 100, T0 - 100))  # b is now the oldest on disk
    c = store.save(b"{}")
    assert [d.id for d in store.list()] == [c.id, a.id]


def test_an_oversize_dump_is_kept_alone_with_a_warning(tmp_path, caplog):
    store = make_store(tmp_path, max_bytes=50)
    store.save(b"x" * 10)
    with caplog.at_level(logging.WARNING, logger="memprof_otel"):
        big = store.save(b"x" * 100)
    assert [d.id for d in store.list()] == [big.id]
    assert "over dumps.max_bytes" in caplog.text


def test_rotation_never_touches_foreign_files(tmp_path):
    store = make_store(tmp_path, max_files=1, max_bytes=10)
    store.save(b"{}")
    (tmp_path / "dumps" / "keep.me").write_bytes(b"x" * 100)
    store.save(b"{}")
    assert (tmp_path / "dumps" / "keep.me").exists()


def test_disk_full_leaves_no_temp_file(tmp_path, monkeypatch):
    store = make_store(tmp_path)
    first = store.save(b"{}")

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(ExportError, match="No space left on device") as ei:
        store.save({"big": 1})
    assert isinstance(ei.value, MemprofError) and isinstance(ei.value, OSError)
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == [first.path.name]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_folder_raises_export_error_and_leaves_nothing(tmp_path):
    store = make_store(tmp_path)
    store.save(b"{}")
    folder = tmp_path / "dumps"
    folder.chmod(0o500)
    try:
        with pytest.raises(ExportError, match="Permission denied"):
            store.save(b"{}")
        assert len(list(folder.iterdir())) == 1
    finally:
        folder.chmod(0o700)


def test_uncreatable_folder_fails_at_save_not_construction(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = DumpStore(blocker / "dumps", 5, 1000)  # parent is a file
    assert store.list() == []
    with pytest.raises(ExportError, match="cannot create dump directory"):
        store.save(b"{}")


@pytest.mark.parametrize("bad", [
    "../x", "/etc/passwd", "%2e%2e", "%2e%2e%2fetc%2fpasswd", "..", "",
    "20231114T221320Z-m-deadbeef/../../x", "20231114T221320Z-m-deadbeef\n",
    "20231114T221320Z-m-DEADBEEF", "20231114T221320Z-a.b-deadbeef", "20231114T221320Z-m-deadbeef.speedscope.json",
    "20231114T221320Z-" + "x" * 41 + "-deadbeef",
])
def test_malformed_ids_are_refused(tmp_path, bad):
    store = make_store(tmp_path)
    store.save(b"{}")
    with pytest.raises(InvalidDumpId):
        store.path_for(bad)
    with pytest.raises(InvalidDumpId):
        store.read(bad)


def test_non_string_id_is_refused(tmp_path):
    with pytest.raises(InvalidDumpId):
        make_store(tmp_path).path_for(None)


def test_missing_id_is_not_found(tmp_path):
    store = make_store(tmp_path)
    with pytest.raises(DumpNotFound):  # no folder at all yet
        store.read("20231114T221320Z-m-deadbeef")
    store.save(b"{}")
    with pytest.raises(DumpNotFound):
        store.path_for("20231114T221320Z-m-deadbeef")


def test_symlink_pointing_outside_is_refused(tmp_path):
    store = make_store(tmp_path)
    store.save(b"{}")
    secret = tmp_path / "secret.json"
    secret.write_text('{"secret": 1}')
    dump_id = "20231114T221320Z-evil-deadbeef"
    (tmp_path / "dumps" / f"{dump_id}.speedscope.json").symlink_to(secret)
    with pytest.raises(InvalidDumpId):
        store.path_for(dump_id)
    with pytest.raises(InvalidDumpId):
        store.read(dump_id)
    assert dump_id not in [d.id for d in store.list()]


def test_symlink_to_a_file_inside_is_served(tmp_path):
    store = make_store(tmp_path)
    real = store.save(b'{"ok":1}')
    alias = "20231114T221320Z-alias-deadbeef"
    (tmp_path / "dumps" / f"{alias}.speedscope.json").symlink_to(real.path.name)
    assert store.read(alias) == b'{"ok":1}'


def test_dangling_symlink_is_not_found(tmp_path):
    store = make_store(tmp_path)
    store.save(b"{}")
    dump_id = "20231114T221320Z-gone-deadbeef"
    (tmp_path / "dumps" / f"{dump_id}.speedscope.json").symlink_to("nothing-here.json")
    with pytest.raises(DumpNotFound):
        store.read(dump_id)


def test_path_for_finds_any_kind(tmp_path):
    store = make_store(tmp_path)
    info = store.save({"events": []}, kind="timeline", model="m")
    assert store.path_for(info.id) == info.path.resolve()
    assert store.list()[0].kind == "timeline"


def test_failure_after_the_temp_file_exists_removes_it(tmp_path, monkeypatch):
    store = make_store(tmp_path)
    store.save(b"{}")

    def broken_fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(ExportError, match="cannot save dump"):
        store.save(b"{}")
    assert leftovers(tmp_path / "dumps") == [] and len(store.list()) == 1


def test_permission_denied_on_temp_file_is_an_export_error(tmp_path, monkeypatch):
    # works as root too, where a read-only folder would not stop the write
    import tempfile

    def denied(**kw):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    store = make_store(tmp_path)
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(ExportError, match="Permission denied"):
        store.save(b"{}")
    assert store.list() == []


def test_oom_records_rotate_apart_from_on_demand_dumps(tmp_path):
    # GIVEN a store keeping 2 on-demand dumps and 2 OOM records, and one OOM record saved first
    store = make_store(tmp_path, max_files=2, max_oom_files=2, max_bytes=10_000)
    oom = store.save({"kind": "oom"}, kind="oom", model="m")
    # WHEN far more on-demand dumps than both caps arrive, some of them large enough to hit max_bytes
    made = [store.save({"pad": "x" * (4000 if i % 3 == 0 else 10)}, model="m") for i in range(50)]
    # THEN the OOM record is still there, untouched, and the on-demand pool is bounded as before
    kinds = {i.id: i.kind for i in store.list()}
    assert kinds[oom.id] == "oom" and store.read(oom.id) == b'{"kind":"oom"}'
    on_demand = [i for i, k in kinds.items() if k != "oom"]
    assert set(on_demand) <= {m.id for m in made[-2:]} and made[-1].id in on_demand
    # AND OOM records rotate among themselves under their own count
    later = [store.save({"kind": "oom", "n": i}, kind="oom", model="m") for i in range(3)]
    ooms = [i.id for i in store.list() if i.kind == "oom"]
    assert sorted(ooms) == sorted(o.id for o in later[-2:])
    assert made[-1].id in {i.id for i in store.list()}  # an OOM save never removes on-demand dumps


def test_max_oom_files_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        DumpStore(tmp_path, 5, 1 << 20, max_oom_files=0)


# ---- whose files rotation may remove; temp files; the default folder --------------------------

def test_rotation_leaves_dumps_this_process_did_not_write(tmp_path):
    folder = tmp_path / "dumps"
    folder.mkdir()
    # files named like dumps, written by someone else (another process sharing the folder)
    theirs = [folder / f"20231114T2213{i:02d}Z-other-0000ff0{i}.speedscope.json" for i in range(4)]
    for i, p in enumerate(theirs):
        p.write_bytes(b"x" * 100)
        os.utime(p, (T0 - 1000 + i, T0 - 1000 + i))  # older than anything of ours
    store = make_store(tmp_path, max_files=2, max_bytes=250)
    ours = [store.save(b"{}").id for _ in range(4)]
    assert all(p.exists() for p in theirs)  # neither the count nor the size cap reached them
    assert sorted(d.id for d in store.list()) == sorted([*ours[2:], *(p.name.split(".")[0] for p in theirs)])
    assert [store.owns(i) for i in ours] == [False, False, True, True]
    assert not store.owns(theirs[0].name.split(".")[0])


def test_a_second_store_of_this_process_on_the_folder_rotates_the_first_ones_files(tmp_path):
    # the dump service makes a new store when the caps change: the files stay this process's
    first = make_store(tmp_path, max_files=5)
    old = [first.save(b"{}").id for _ in range(3)]
    second = DumpStore(tmp_path / "dumps", 2, 1 << 20, clock=clock_from(T0 + 100), token=tokens())
    new = second.save(b"{}").id
    assert [d.id for d in second.list()] == [new, old[2]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_rotate_its_parents_files(tmp_path):
    store = make_store(tmp_path, max_files=5)
    parent = [store.save(b"{}").id for _ in range(3)]
    pid = os.fork()
    if pid == 0:  # the child: its own store, max_files 1
        try:
            DumpStore(tmp_path / "dumps", 1, 1 << 20).save(b"{}")
            DumpStore(tmp_path / "dumps", 1, 1 << 20).save(b"{}")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    ids = {d.id for d in store.list()}
    assert set(parent) <= ids and len(ids) == 4  # the parent's three, and the child's last one


def test_a_stale_temp_file_is_removed_and_a_fresh_one_kept(tmp_path):
    store = make_store(tmp_path)
    store.save(b"{}")
    folder = tmp_path / "dumps"
    left = folder / ".memprof-killed.tmp"
    left.write_bytes(b'{"half')
    store.save(b"{}")  # an hour is the default: a fresh temp file may be a write in progress
    assert left.exists()
    assert ".memprof-killed.tmp" not in {d.path.name for d in store.list()}
    time.sleep(0.01)
    make_store(tmp_path, stale_temp_seconds=0.005).save(b"{}")
    assert not left.exists()
    assert len(store.list()) == 3


def test_default_dir_is_per_service_and_pid():
    assert default_dir("inference", 4242, base="/b") == Path("/b/memprof-otel-dumps-inference-4242")
    assert default_dir("my svc/v1.2", 7, base="/b") == Path("/b/memprof-otel-dumps-my_svc_v1_2-7")
    assert default_dir("", 7, base="/b") == Path("/b/memprof-otel-dumps-memprof-otel-7")
    assert default_dir("x", 1) != default_dir("x", 2)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_a_private_store_refuses_a_folder_open_to_others_or_a_symlink(tmp_path):
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o777)
    opened.chmod(0o777)  # what another user would make first, for us to write into
    with pytest.raises(ExportError, match="not a private folder"):
        DumpStore(opened, 5, 1000, private=True).save(b"{}")
    assert list(opened.iterdir()) == []
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ExportError, match="not a private folder"):
        DumpStore(link, 5, 1000, private=True).save(b"{}")
    assert list(real.iterdir()) == []
    assert DumpStore(tmp_path / "fresh", 5, 1000, private=True).save(b"{}").path.exists()
    assert DumpStore(opened, 5, 1000).save(b"{}").path.exists()  # an explicit folder is the user's call


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_a_private_store_whose_folder_was_opened_lists_and_serves_nothing(tmp_path):
    folder = tmp_path / "own"
    store = DumpStore(folder, 5, 1000, private=True)
    mine = store.save(b"{}", model="m")
    assert [d.id for d in store.list()] == [mine.id]
    folder.chmod(0o777)  # someone may now plant files here for us to serve as our own
    with pytest.raises(ExportError, match="not a private folder"):
        store.list()
    with pytest.raises(ExportError, match="not a private folder"):
        store.read(mine.id)
    folder.chmod(0o700)
    assert store.read(mine.id) == b"{}"  # private again: served again
    assert DumpStore(tmp_path / "never-made", 5, 1000, private=True).list() == []  # no folder: nothing yet


@pytest.mark.parametrize("dump_id", ["20991327T999999Z-x-00000000", "20250230T000000Z-x-00000000",
                                     "20250101T240000Z-x-00000000", "20250101T000060Z-x-00000000",
                                     "00000101T000000Z-x-00000000"])
def test_an_id_whose_date_does_not_exist_is_invalid_and_never_listed(tmp_path, dump_id):
    assert ID_RE.fullmatch(dump_id) and not is_dump_id(dump_id)
    store = DumpStore(tmp_path)
    (tmp_path / f"{dump_id}.speedscope.json").write_bytes(b"{}")
    with pytest.raises(InvalidDumpId):
        store.read(dump_id)
    assert store.list() == []


def test_every_id_make_id_writes_is_valid():
    for t in (0.0, T0, 4102444799.0):
        assert is_dump_id(make_id(t, "m", "0123abcd"))


def test_a_malformed_id_is_not_echoed_in_full(tmp_path):
    with pytest.raises(InvalidDumpId) as e:
        DumpStore(tmp_path).read("x" * 20_000)
    assert len(str(e.value)) < 100
