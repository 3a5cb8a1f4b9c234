from __future__ import annotations

from ursa.protocol.ids import derived_id, model_transfer_id


def test_a_derived_id_depends_on_every_part_and_only_on_them() -> None:
    assert derived_id("d1", "update", 3) == derived_id("d1", "update", 3)
    assert derived_id("d1", "update", 3) != derived_id("d1", "update", 4)
    assert derived_id("d1", "update", 3) != derived_id("d2", "update", 3)
    assert len(derived_id("x")) == 32 and int(derived_id("x"), 16) >= 0


def test_a_model_transfer_id_names_one_federation_model_and_version() -> None:
    tid = model_transfer_id("f", "classifier", 3)
    assert len(tid) == 32 and tid == model_transfer_id("f", "classifier", 3)
    assert tid != model_transfer_id("f", "classifier", 4)
    assert tid != model_transfer_id("g", "classifier", 3)
    assert tid != model_transfer_id("f", "made", 3)
