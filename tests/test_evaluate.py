"""Reply-quality metrics and the `eval` command."""

import csv
import json

import pytest
import sacrebleu

from chatbot.cli.main import main
from chatbot.training.evaluate import distinct_n, reply_metrics, write_replies


def test_distinct_n_counts_unique_word_ngrams_over_all_replies():
    replies = ["좋은 아침 이에요", "좋은 아침 입니다"]
    assert distinct_n(replies, 1) == pytest.approx(4 / 6)  # 좋은, 아침, 이에요, 입니다
    assert distinct_n(replies, 2) == pytest.approx(3 / 4)  # (좋은 아침) twice
    assert distinct_n(["네"], 2) == 0.0


def test_reply_metrics_tell_a_collapsed_model_from_a_good_one():
    references = ["맛있는 거 드세요.", "푹 쉬세요.", "우산 챙기세요.", "좋은 꿈 꾸세요."]
    good = reply_metrics(["맛있는 거 드세요.", "푹 쉬세요.", "우산 챙기세요.", "좋은 꿈 꿔요."], references)
    collapsed = reply_metrics(["좋은 하루 보내세요."] * 4, references)
    assert good["exact_match"] == 0.75 and good["unique_ratio"] == 1.0
    assert collapsed["unique_ratio"] == 0.25 and collapsed["exact_match"] == 0.0
    assert good["chrf"] > collapsed["chrf"] + 30
    assert good["distinct_2"] > collapsed["distinct_2"]
    with pytest.raises(ValueError):
        reply_metrics(["하나"], ["하나", "둘"])


def test_eval_prints_metrics_whose_chrf_and_bleu_equal_sacrebleus(tiny_model_dir, tiny_bot, tiny_csv, tmp_path,
                                                                  capsys, monkeypatch):
    from chatbot.decoding.chatbot import Chatbot

    # The metrics are under test here, not XLA, whose compilations for each batch shape cost seconds on a CPU:
    # the command gets the model it names as the session's plain-graph bot, its graphs traced already
    # (test_cli.py's piped chat keeps XLA).
    loaded = []
    monkeypatch.setattr(Chatbot, "load", classmethod(lambda cls, path: loaded.append(path) or tiny_bot))
    replies_path = tmp_path / "replies.csv"
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(tiny_csv), "--replies", str(replies_path),
                 "--latency-sample", "3"]) == 0
    assert loaded == [str(tiny_model_dir)]
    result = json.loads(capsys.readouterr().out)
    with open(replies_path, encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert result["n"] == len(rows) == 30
    replies, references = [r["reply"] for r in rows], [r["A"] for r in rows]
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(replies, [references]).score)
    assert result["bleu_char"] == pytest.approx(sacrebleu.corpus_bleu(replies, [references], tokenize="char").score)
    # The tiny model was overfit on these pairs: it should answer nearly all of them exactly.
    assert result["exact_match"] >= 0.8 and result["token_accuracy"] >= 0.8
    assert result["perplexity"] == pytest.approx(2.718281828 ** result["loss"], rel=1e-6)
    for key in ("unique_ratio", "distinct_1", "distinct_2", "mean_reply_chars", "ms_per_reply_p50",
                "ms_per_reply_p95"):
        assert key in result


def test_eval_refuses_to_overwrite_replies_and_reports_bad_data(tiny_model_dir, tiny_csv, tmp_path, capsys):
    existing = tmp_path / "replies.csv"
    existing.write_text("keep me", encoding="utf-8")
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(tiny_csv), "--replies", str(existing)]) == 2
    assert existing.read_text(encoding="utf-8") == "keep me"
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(tmp_path / "missing.csv")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("error: ") for line in errors)


@pytest.mark.parametrize("cell", ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"])
def test_replies_that_a_spreadsheet_would_run_are_written_as_text(tmp_path, cell):
    """OWASP's CSV-injection rule: a cell that starts with = + - @ tab or CR gets a leading apostrophe."""
    path = tmp_path / "replies.csv"
    write_replies(path, [cell, "안녕"], ["답", cell], [cell, "반가워요"])
    with open(path, encoding="utf-8", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[1] == ["'" + cell, "답", "'" + cell] and rows[2] == ["안녕", "'" + cell, "반가워요"]
    assert all(not value.startswith(("=", "+", "-", "@", "\t", "\r")) for row in rows for value in row)
