"""The model directory: complete or absent, checked before TensorFlow loads, one-line errors."""

import json
import shutil

import pytest

from chatbot.artifacts import (CONFIG_FILE, INDEX_FILE, MODEL_FILE, TOKENIZER_FILE, ArtifactError, atomic_write_bytes,
                               check_model_dir, load_model_dir, save_model_dir)


def copy_of(model_dir, tmp_path, name="copy"):
    return shutil.copytree(model_dir, tmp_path / name)


def test_a_wrong_vocabulary_or_a_missing_file_is_refused(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in (CONFIG_FILE, MODEL_FILE):
        (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    (broken / TOKENIZER_FILE).write_bytes(b"not the vocabulary")
    with pytest.raises(ArtifactError, match="vocabulary hash"):
        load_model_dir(broken)
    with pytest.raises(ArtifactError, match="missing"):
        load_model_dir(tmp_path)
    with pytest.raises(ArtifactError, match="no model directory"):
        check_model_dir(tmp_path / "nothing")


def test_a_model_of_another_version_is_refused(tiny_model_dir, tmp_path):
    old = copy_of(tiny_model_dir, tmp_path)
    config = json.loads((old / CONFIG_FILE).read_text(encoding="utf-8"))
    config["version"] = "0.0.1"
    (old / CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ArtifactError, match="retrain"):
        check_model_dir(old)


def test_a_corrupt_model_file_is_one_line_artifact_error(tiny_model_dir, tmp_path):
    corrupt = copy_of(tiny_model_dir, tmp_path)
    (corrupt / MODEL_FILE).write_bytes(b"not a zip")
    check_model_dir(corrupt)  # the files are all there...
    with pytest.raises(ArtifactError, match="cannot load the model") as error:
        load_model_dir(corrupt)  # ...but the model does not load
    assert "\n" not in str(error.value)


def test_saving_replaces_only_when_asked_and_leaves_no_temporary(tiny_model_dir, tmp_path):
    config, tokenizer, model, _ = load_model_dir(tiny_model_dir)
    index = {INDEX_FILE: (tiny_model_dir / INDEX_FILE).read_bytes()}
    out = save_model_dir(tmp_path / "saved", config, tokenizer, model, {**index, "note.txt": b"hi"})
    assert check_model_dir(out) == config and (out / "note.txt").read_bytes() == b"hi"
    before = (out / MODEL_FILE).read_bytes()
    with pytest.raises(ArtifactError, match="already exists"):
        save_model_dir(out, config, tokenizer, model, index)
    save_model_dir(out, config, tokenizer, model, index, overwrite=True)
    assert (out / MODEL_FILE).stat().st_size == len(before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]


def test_a_missing_or_edited_retrieval_index_is_refused(tiny_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    index = (copy / INDEX_FILE).read_bytes()
    (copy / INDEX_FILE).write_bytes(index.replace("반가워요".encode(), "싫어요".encode()))
    with pytest.raises(ArtifactError, match="does not match the index hash"):
        check_model_dir(copy)
    (copy / INDEX_FILE).unlink()
    with pytest.raises(ArtifactError, match=f"missing {INDEX_FILE}"):
        check_model_dir(copy)


def test_atomic_write_leaves_the_old_file_when_it_fails(tmp_path):
    path = tmp_path / "file.txt"
    atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["file.txt"]
