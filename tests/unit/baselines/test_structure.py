"""Structure apart from names: subtree digests and rename matching."""
from __future__ import annotations

from memprof_otel.baselines.structure import fingerprint, match_renames, parent, subtrees

LIN = "Linear(weight=float32[8,8])"
NET = {"": "Net()", "blocks": "ModuleList()", "blocks.0": "Block()", "blocks.0.fc": LIN,
       "blocks.1": "Block()", "blocks.1.fc": LIN, "head": "Linear(weight=float32[2,8])"}


def renamed(sigs: dict[str, str], old: str, new: str) -> dict[str, str]:
    return {(new + p[len(old):] if p == old or p.startswith(old + ".") else p): s for p, s in sigs.items()}


def test_parent() -> None:
    assert [parent(p) for p in ("", "a", "a.b", "a.b.c")] == [None, "", "a", "a.b"]


def test_subtree_ignores_names_and_sees_children() -> None:
    a, b = subtrees(NET), subtrees(renamed(NET, "blocks", "layers"))
    assert a["blocks"] == b["layers"] and a["blocks.1.fc"] == b["layers.1.fc"] and a[""] == b[""]
    assert a["blocks.0"] == a["blocks.1"]  # identical blocks, identical shape
    wider = dict(NET, **{"blocks.1.fc": "Linear(weight=float32[9,8])"})
    c = subtrees(wider)
    assert c["blocks.1"] != a["blocks.1"] and c["blocks"] != a["blocks"] and c["blocks.0"] == a["blocks.0"]


def test_fingerprint_sees_names_and_shapes() -> None:
    assert fingerprint(NET) == fingerprint(dict(reversed(NET.items())))  # order of the mapping: no matter
    assert fingerprint(NET) != fingerprint(renamed(NET, "head", "out"))
    assert fingerprint(NET) != fingerprint(dict(NET, head="Linear(weight=float32[3,8])"))


def test_renames_pair_in_model_order() -> None:
    new = renamed(NET, "blocks", "layers")
    removed = [p for p in NET if p not in new]
    added = [p for p in new if p not in NET]
    pairs = match_renames(removed, added, subtrees(NET), subtrees(new))
    assert pairs == [("blocks", "layers"), ("blocks.0", "layers.0"), ("blocks.0.fc", "layers.0.fc"),
                     ("blocks.1", "layers.1"), ("blocks.1.fc", "layers.1.fc")]


def test_a_changed_layer_under_a_new_name_is_not_a_rename() -> None:
    new = renamed(NET, "head", "out")
    new["out"] = "Linear(weight=float32[3,8])"
    assert match_renames(["head"], ["out"], subtrees(NET), subtrees(new)) == []


def test_layers_without_a_signature_are_never_matched() -> None:
    old, new = {"": "", "a": ""}, {"": "", "b": ""}
    assert match_renames(["a"], ["b"], subtrees(old), subtrees(new)) == []
