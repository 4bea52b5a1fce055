"""A model split in several GGUF files (gguf-split) is one model in the app: any of its parts or their folder
imports it once, under its name without the part number, with the size of all of its parts."""
import shutil

import pytest

from app.core.sqlite_registry import check_model
from tests.support.gguf_split_write import split_gguf


@pytest.fixture
def parts(tiny_models_q8, tmp_path):
    return split_gguf(tiny_models_q8["llama"].gguf_path, tmp_path / "tiny-q8" / "tiny.gguf", 7)


def test_any_part_or_their_folder_imports_one_model_with_every_part_s_size(parley, qtbot, parts):
    from app.qt.models_dialog import ModelsDialog

    models = parley.models
    key = models.import_path(parts[2])
    qtbot.waitUntil(lambda: models.registry.get(key) is not None, timeout=60_000)
    assert key == str(parts[0]) and models.registry.get(key).name == "tiny"
    assert models.import_path(parts[0]) == key and models.import_path(parts[0].parent) == key
    assert [e.key for e in models.registry.entries()] == ["default", key]
    row = next(row for row in ModelsDialog(models).rows() if row[0] == "tiny")
    total = sum(p.stat().st_size for p in parts)
    assert row[5] == f"{total / 1e6:.1f} MB" and total > 2 * parts[0].stat().st_size


def test_a_part_missing_is_refused_before_loading_naming_it(parts):
    assert check_model(parts[3]) == "gguf"
    parts[1].unlink()
    with pytest.raises(ValueError, match="tiny-00002-of-00004.gguf is missing"):
        check_model(parts[3])


def test_a_copy_of_the_parts_elsewhere_is_the_same_model(parts, tmp_path):
    from app.qt.model_manager import fingerprint

    copy = tmp_path / "copy"
    shutil.copytree(parts[0].parent, copy)
    assert fingerprint(str(copy / parts[0].name)) == fingerprint(str(parts[0]))
    (copy / parts[3].name).write_bytes(b"GGUF" + bytes(100))  # another last part: another model
    assert fingerprint(str(copy / parts[0].name)) != fingerprint(str(parts[0]))


def test_split_parts_in_the_hugging_face_cache_are_named_by_their_repo(parts, tmp_path):
    """huggingface_hub keeps a split model's parts in a folder per quantization under the snapshot, each a link to a
    blob: any link names the model once, by the repo and the parts' name (it was the parts' name alone)."""
    from app.core.model_registry import ModelRegistry

    repo = tmp_path / "hub" / "models--org--Tiny-GGUF"
    quant = repo / "snapshots" / "0f3c1e9a8b7d" / "Q8_0"
    quant.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, part in enumerate(parts):
        shutil.copyfile(part, repo / "blobs" / f"{i}bd1e5")
        (quant / part.name).symlink_to(repo / "blobs" / f"{i}bd1e5")
    entries = {ModelRegistry().candidate(p) for p in (quant / parts[2].name, quant / parts[0].name, quant)}
    assert [(e.name, e.path) for e in entries] == [("org/Tiny-GGUF · tiny", str(quant / parts[0].name))]
