"""The model directory: complete or absent, checked before TensorFlow loads, one-line errors."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from chatbot.artifacts import (CONFIG_FILE, INDEX_FILE, MODEL_FILE, SENTENCE_FILE, TOKENIZER_FILE, ArtifactError,
                               array_bytes, check_model_dir, load_model_dir, save_model_dir)
from chatbot.files import atomic_write_bytes


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
    with pytest.raises(ArtifactError, match="model.keras is damaged") as error:
        load_model_dir(corrupt)  # ...but the model does not load
    assert "\n" not in str(error.value)


def test_a_truncated_model_file_is_called_damaged_not_missing(tiny_model_dir, tmp_path):
    cut = copy_of(tiny_model_dir, tmp_path)
    data = (cut / MODEL_FILE).read_bytes()
    (cut / MODEL_FILE).write_bytes(data[:len(data) // 2])
    with pytest.raises(ArtifactError, match="model.keras is damaged"):
        load_model_dir(cut)


def test_a_directory_swapped_while_loading_is_never_mixed(tiny_model_dir, tmp_path, monkeypatch):
    """A save that swaps another run's directory in while a load reads it (`train --overwrite` finishing as the
    app loads that model): the load gets one directory's files, all of them, never one's weights with the other's
    tokenizer or index."""
    import chatbot.artifacts as artifacts

    model_dir = copy_of(tiny_model_dir, tmp_path)
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    config = json.loads((other / CONFIG_FILE).read_text(encoding="utf-8"))
    config["model"]["max_length"] += 1  # marks which directory the config came from
    (other / CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")
    (other / MODEL_FILE).write_bytes(b"the other run's weights")  # marks which directory the model came from
    real_open, swapped = artifacts.os.open, []

    def swap_after_the_config_is_read(file, flags, *args, **kwargs):
        handle = real_open(file, flags, *args, **kwargs)
        if file == CONFIG_FILE and not swapped:  # the save's two renames, right after the config was read
            swapped.append(True)
            artifacts.os.replace(model_dir, tmp_path / "old")
            artifacts.os.replace(other, model_dir)
        return handle

    monkeypatch.setattr(artifacts.os, "open", swap_after_the_config_is_read)
    files = artifacts._read_files(model_dir)
    assert swapped
    assert files[MODEL_FILE] == (model_dir / MODEL_FILE).read_bytes()  # read again: all from the new directory
    assert json.loads(files[CONFIG_FILE])["model"]["max_length"] == config["model"]["max_length"]


def test_saving_replaces_only_when_asked_and_leaves_no_temporary(tiny_model_dir, tmp_path):
    config, tokenizer, model, _ = load_model_dir(tiny_model_dir)
    index = {name: (tiny_model_dir / name).read_bytes() for name in (INDEX_FILE, SENTENCE_FILE)}
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


# -- what a kill leaves beside a model directory ------------------------------

def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()  # reaped: the pid names no process now
    return process.pid


def test_temporaries_of_killed_saves_are_removed_by_the_next_save(tiny_model_dir, tmp_path):
    config, tokenizer, model, _ = load_model_dir(tiny_model_dir)
    dead = [tmp_path / ".saved.k3x9_q2a.tmp", tmp_path / f".saved.{dead_pid()}.0a1b2c3d.tmp"]  # old and new names
    live = [tmp_path / f".saved.{os.getpid()}.0a1b2c3d.tmp", tmp_path / ".other.k3x9_q2a.tmp"]  # a save going on
    for path in dead + live:
        path.mkdir()
        (path / MODEL_FILE).write_bytes(b"half a model")
    save_model_dir(tmp_path / "saved", config, tokenizer, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["saved", *(p.name for p in live)])


def test_a_kill_between_the_two_renames_of_an_overwrite_is_undone_by_the_next_load(tiny_model_dir, tmp_path):
    out = tmp_path / "model"
    shutil.copytree(tiny_model_dir, tmp_path / ".model.old")  # the new one never got in place
    assert check_model_dir(out) and sorted(p.name for p in tmp_path.iterdir()) == ["model"]

    os.replace(out, tmp_path / ".model.old")
    shutil.copytree(tiny_model_dir, tmp_path / ".model.new")  # complete before the swap began: it wins
    (tmp_path / ".model.new" / "note.txt").write_text("new")
    load_model_dir(out)
    assert (out / "note.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_save_over_a_model_clears_the_swap_leftovers_beside_it(tiny_model_dir, tmp_path):
    config, tokenizer, model, _ = load_model_dir(tiny_model_dir)
    out = shutil.copytree(tiny_model_dir, tmp_path / "model")
    for stale in (".model.old", ".model.new"):
        shutil.copytree(tiny_model_dir, tmp_path / stale)
    save_model_dir(out, config, tokenizer, model, {"note.txt": b"newest"}, overwrite=True)
    assert (out / "note.txt").read_bytes() == b"newest" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_model_directory_keeps_its_index_embeddings_and_loads_them_instead_of_embedding_again(tiny_model_dir,
                                                                                                tmp_path):
    """The sentence encoder's embeddings of the index are saved (float16) and loaded as they are; a directory
    without them, or with ones that do not fit the index, embeds its questions again."""
    import numpy as np

    from chatbot.artifacts import EMBEDDINGS_FILE

    _, _, _, retriever = load_model_dir(tiny_model_dir)
    saved = np.load(tiny_model_dir / EMBEDDINGS_FILE)
    assert saved.dtype == np.float16 and saved.shape == tuple(retriever.embeddings.shape)
    assert np.allclose(retriever.embeddings.numpy(), saved.astype(np.float32))
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    (copy / EMBEDDINGS_FILE).write_bytes(array_bytes(np.zeros((2, 3), np.float16)))  # not this index's
    _, _, _, again = load_model_dir(copy)
    assert np.allclose(again.embeddings.numpy(), saved.astype(np.float32), atol=2e-3)
