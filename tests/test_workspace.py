"""The app's workspace: input limits, the model shelf, uploaded CSVs and the web UI's training sizes."""

import re
import shutil

import pytest

from app import clip_question
from chatbot.artifacts import ArtifactError
from chatbot.app.workspace import (TRAINING_SIZES, ModelShelf, TrainingJob, attention_choices,
                               load_chatbot, read_training_csv, training_config, unique_model_dir)
from conftest import stages_run


def test_long_question_is_cut_with_a_notice():
    question, notice = clip_question("가" * 500, 200)
    assert question == "가" * 200 and "200" in notice
    assert clip_question("  안녕  ", 200) == ("안녕", "")
    assert clip_question(None, 200) == ("", "")


def test_model_shelf_offers_only_model_directories_under_the_root(tiny_bot, tiny_model_dir, tmp_path):
    shutil.copytree(tiny_model_dir, tmp_path / "other")
    shutil.copytree(tiny_model_dir, tmp_path / ".hidden")  # e.g. a half-written save
    (tmp_path / "no-config").mkdir()
    (tmp_path / "file.txt").write_text("x")
    shelf = ModelShelf(tmp_path, tiny_bot)
    assert shelf.choices() == [("tiny (시작 모델)", ""), ("other", "other")]
    assert shelf.get("") is tiny_bot and shelf.get("other") is shelf.get("other") is not tiny_bot
    assert shelf.get("other").compilation is tiny_bot.compilation == "graph"  # as the startup model
    for name in (".hidden", "no-config", "../" + tmp_path.name + "/other", str(tmp_path / "other")):
        with pytest.raises(ArtifactError):
            shelf.get(name)


def test_a_startup_model_under_the_root_is_listed_by_name(tiny_bot, tiny_model_dir):
    shelf = ModelShelf(tiny_model_dir.parent, load_chatbot(tiny_model_dir))
    assert shelf.startup_name == "tiny" and ("tiny", "tiny") in shelf.choices()
    assert ("tiny (시작 모델)", "") not in shelf.choices()


def test_the_attention_tab_offers_every_layer_and_head_numbered_from_one(tiny_bot):
    layers, heads = attention_choices(tiny_bot)
    assert layers == list(range(1, tiny_bot.config.model.num_layers + 1)) == [1]
    assert heads == list(range(1, tiny_bot.config.model.num_heads + 1)) == [1, 2]


def test_uploaded_csvs_get_the_loaders_report_or_one_error(tmp_path, tiny_csv):
    pairs, report = read_training_csv(str(tiny_csv), 2**20, [tiny_csv.parent])
    assert len(pairs) == 30 and report.startswith("data: tiny.csv (utf-8)")
    big = tmp_path / "big.csv"
    big.write_text("Q,A\n" + "안녕하세요,반가워요\n" * 1000, encoding="utf-8")
    pairs, message = read_training_csv(str(big), 1000, [tmp_path])
    assert pairs is None and message.startswith("error: big.csv: 파일이 너무 커요")
    bad = tmp_path / "bad.csv"
    bad.write_bytes("질문,라벨\n안녕하세요,0\n".encode("cp949"))
    pairs, message = read_training_csv(str(bad), 2**20, [tmp_path])
    assert pairs is None and message.startswith("error: bad.csv:1: ")
    assert read_training_csv(None, 2**20, []) == (None, "error: CSV 파일을 먼저 올려 주세요.")


def test_training_sizes_give_valid_configs():
    for size in TRAINING_SIZES:
        assert training_config(3, size).train.epochs == 3
    with pytest.raises(ValueError, match="huge"):
        training_config(3, "huge")


def test_new_model_directories_never_collide(tmp_path):
    first = unique_model_dir(tmp_path, "내 데이터!.csv")
    assert re.fullmatch(r"내-데이터-csv-\d{8}-\d{6}", first.name)
    first.mkdir()
    assert unique_model_dir(tmp_path, "내 데이터!.csv").name == first.name + "-2"


def test_training_job_reports_progress_and_outcome(tmp_path):
    job = TrainingJob(tmp_path / "m", epochs=2)
    job.end_epoch(1, {"loss": 1.5, "learning_rate": 0.1})
    assert job.fraction() == 0.5 and "에포크 1/2 · loss 1.5000" in job.summary()
    assert "learning_rate" not in job.summary() and "학습 중" in job.summary()
    job.finished.set()
    assert "학습 완료" in job.summary()


def test_a_model_loading_keeps_no_request_for_a_loaded_model_waiting(tiny_bot, tiny_model_dir, tmp_path, monkeypatch):
    """A picked model loads (seconds, with its first replies traced) while the others keep answering."""
    import threading

    import chatbot.app.workspace as workspace

    shutil.copytree(tiny_model_dir, tmp_path / "other")
    loading, release, asked = threading.Event(), threading.Event(), []

    def slow_load(path, compilation, prepare):
        asked.append((path.name, compilation, prepare))
        loading.set()
        release.wait(60)
        return tiny_bot

    monkeypatch.setattr(workspace, "load_chatbot", slow_load)
    shelf = ModelShelf(tmp_path, tiny_bot, prepare=True)
    picking = threading.Thread(target=shelf.get, args=("other",), daemon=True)  # daemons: a hang fails the test
    picking.start()
    assert loading.wait(60)
    answered = []
    asking = threading.Thread(target=lambda: answered.append(shelf.get("")), daemon=True)
    asking.start()
    asking.join(60)
    assert answered == [tiny_bot] and picking.is_alive()  # answered while "other" is still loading
    release.set()
    picking.join(60)
    assert not picking.is_alive()
    assert asked == [("other", "graph", True)] and shelf.get("other") is tiny_bot  # as the first bot compiles


@pytest.mark.slow  # traces a fresh model's first replies, as the app's start does
def test_a_prepared_model_answers_and_streams_without_tracing_again(tiny_model_dir):
    bot = load_chatbot(tiny_model_dir, "warmed", prepare=True)
    assert [plan.jit for plan in bot.compiled_plans] == [False]  # plain graphs, no XLA
    assert bot.ready(bot.compiled_plans[0])
    ran = stages_run(bot)
    bot.reply_batch(["배고파", "오늘 회사에서 상사한테 혼나서 기분이 너무 안 좋아"] * 3)
    list(bot.stream("안녕하세요"))  # streamed steps are traced per encoder-length bucket: this one's is the prepared one
    assert ran == []
    bot.reply("배고파", strategy="beam", num_beams=3)  # settings not prepared: traced now, as the record shows
    assert "loop" in ran


def test_a_csv_outside_the_upload_folders_or_linked_out_of_them_is_not_read(tmp_path, tiny_csv):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    (uploads / "link.csv").symlink_to(tiny_csv)  # inside by name, outside once resolved
    for path in (tiny_csv, uploads / "link.csv", uploads / ".." / tiny_csv.name, uploads / "missing.csv"):
        pairs, message = read_training_csv(str(path), 2**20, [uploads])
        assert pairs is None and "이 앱에 올린 파일만" in message
    shutil.copy(tiny_csv, uploads / "tiny.csv")
    assert read_training_csv(str(uploads / "tiny.csv"), 2**20, [uploads])[0]


def test_a_training_run_is_refused_only_when_its_memory_would_not_fit():
    from chatbot.app.workspace import training_memory_refusal

    assert training_memory_refusal(1_000, 22_000.0) is None
    assert training_memory_refusal(134_795, None) is None  # unknown: the run is not refused on a guess
    small, large = training_memory_refusal(134_795, 4_096.0), training_memory_refusal(1_000_000, 22_000.0)
    assert small.startswith("error: 134,795개") and "4.0 GB" in small and large.startswith("error: 1,000,000개")
