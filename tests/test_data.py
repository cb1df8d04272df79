import pytest

from chatbot.data.pairs import DataError, QAPair, load_pairs, split_by_question
from chatbot.data.text import normalize
from conftest import SHARED_CHATBOT_DATA, TINY_PAIRS, write_csv


def test_normalize_keeps_jamo_and_emoji_and_folds_whitespace():
    assert normalize("  ㅋㅋㅋ\t진짜\u3000웃겨 😀 ㅠㅠ \n") == "ㅋㅋㅋ 진짜 웃겨 😀 ㅠㅠ"


def test_normalize_composes_decomposed_hangul():
    decomposed = "\u1112\u1161\u1102\u1173\u11af"  # 하늘 as conjoining jamo (NFD)
    assert normalize(decomposed) == "하늘"


def test_reads_cp949_file(tmp_path):
    path = write_csv(tmp_path / "excel.csv", TINY_PAIRS[:5], encoding="cp949")
    pairs, report = load_pairs(path)
    assert report.encoding == "cp949"
    assert pairs[0].question == "안녕하세요" and pairs[0].answer == "반가워요."


def test_reads_utf8_with_bom(tmp_path):
    path = write_csv(tmp_path / "bom.csv", TINY_PAIRS[:5], encoding="utf-8-sig")
    pairs, report = load_pairs(path)
    assert report.encoding == "utf-8-sig"
    assert [p.question for p in pairs][:2] == ["안녕하세요", "배고파"]


def test_column_aliases_are_case_insensitive(tmp_path):
    path = write_csv(tmp_path / "aliases.csv", [("배고파", "밥 드세요.")], header=("Question", "ANSWER"))
    pairs, _ = load_pairs(path)
    assert pairs[0].question == "배고파" and pairs[0].label is None


def test_missing_answer_column_names_the_problem(tmp_path):
    path = write_csv(tmp_path / "noanswer.csv", [("배고파", 0)], header=("Q", "label"))
    with pytest.raises(DataError, match="no answer column"):
        load_pairs(path)


@pytest.mark.parametrize("content, reason", [
    (b"", "empty"),
    (b"Q,A,label\n", "no usable rows"),
    (b"Q,A\n,\n  ,x\n", "no usable rows"),
    (b"\xff\xfe\x00\xd8\x00\xdc" * 20, "cannot decode"),
])
def test_unusable_files_raise_data_error(tmp_path, content, reason):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=reason) as error:
        load_pairs(path)
    assert str(path) in str(error.value)


def test_missing_file_raises_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_pairs(tmp_path / "nope.csv")


def test_empty_rows_and_duplicates_are_dropped_and_counted(tmp_path):
    rows = [("배고파", "밥 드세요.", 0), ("", "답만 있음", 0), ("질문만", "", 1), ("배고파", "밥 드세요.", 0),
            ("졸려", "주무세요.", 0)]
    pairs, report = load_pairs(write_csv(tmp_path / "mixed.csv", rows))
    assert [p.question for p in pairs] == ["배고파", "졸려"]
    assert report.dropped_empty == [3, 4] and report.dropped_duplicates == [5]
    assert "dropped, empty Q/A   2" in str(report)


def test_nan_cells_are_dropped(tmp_path):
    path = tmp_path / "nan.csv"
    path.write_text("Q,A,label\n배고파,,0\n,답,1\n졸려,주무세요.,0\n", encoding="utf-8")
    pairs, report = load_pairs(path)
    assert len(pairs) == 1 and len(report.dropped_empty) == 2


def test_labels_are_cleaned_and_bad_ones_cleared(tmp_path):
    rows = [("a", "b", "2   "), ("c", "d", "1.0"), ("e", "f", "x"), ("g", "h", "7"), ("i", "j", "")]
    pairs, report = load_pairs(write_csv(tmp_path / "labels.csv", rows))
    assert [p.label for p in pairs] == [2, 1, None, None, None]
    assert report.labels_cleared == [4, 5, 6]


def test_split_is_deterministic_and_keeps_questions_on_one_side(tmp_path):
    rows = [(f"질문 {i % 40}", f"답 {i}", 0) for i in range(120)]
    pairs, _ = load_pairs(write_csv(tmp_path / "split.csv", rows))
    train, val = split_by_question(pairs, 0.25, seed=3)
    assert split_by_question(pairs, 0.25, seed=3) == (train, val)
    assert not {p.question for p in train} & {p.question for p in val}
    assert len({p.question for p in val}) == 10
    assert split_by_question(pairs, 0.25, seed=4)[1] != val


@pytest.mark.skipif(not SHARED_CHATBOT_DATA.exists(), reason="../shared/data/ChatbotData.csv not present")
def test_public_chatbot_data_loads_with_its_odd_label():
    pairs, report = load_pairs(SHARED_CHATBOT_DATA)
    assert report.used > 11000 and set(report.label_counts) == {0, 1, 2}
    assert report.labels_cleared == []


# -- CSV reading ----------------------------------------------------------------

def test_an_extra_field_in_the_first_data_row_is_refused_not_shifted(tmp_path):
    path = tmp_path / "extra.csv"
    path.write_text("Q,A,label\n배고파,밥 드세요.,0,덤\n졸려,주무세요.,0\n", encoding="utf-8")
    with pytest.raises(DataError, match="4 fields but the header has 3") as error:
        load_pairs(path)
    assert error.value.row == 2


def test_empty_trailing_fields_are_ignored_and_short_rows_padded(tmp_path):
    path = tmp_path / "trailing.csv"
    path.write_text("Q,A,label\n배고파,밥 드세요.,0,,\n졸려,주무세요.\n", encoding="utf-8")
    pairs, _ = load_pairs(path)
    assert pairs == [QAPair("배고파", "밥 드세요.", 0), QAPair("졸려", "주무세요.", None)]


def test_row_numbers_count_blank_lines_and_quoted_line_breaks(tmp_path):
    path = tmp_path / "lines.csv"
    path.write_text('Q,A,label\n\n배고파,"밥\n드세요.",0\n\n\n,답만,0\n졸려,주무세요.,7\n"여러\n\n줄",,1\n배고파,"밥\n드세요.",0\n',
                    encoding="utf-8")
    pairs, report = load_pairs(path)
    assert [p.answer for p in pairs] == ["밥 드세요.", "주무세요."]
    # lines: 1 header, 2 blank, 3-4 배고파, 5-6 blank, 7 ",답만", 8 졸려, 9-11 "여러..줄", 12-13 배고파 again
    assert report.dropped_empty == [7, 9] and report.labels_cleared == [8] and report.dropped_duplicates == [12]


def test_shift_jis_bytes_are_refused_not_read_as_cp949(tmp_path):
    rows = [("こんにちは", "元気ですか。", 0), ("おなかすいた", "ご飯を食べましょう。", 0), ("ねむい", "おやすみなさい。", 0)]
    path = write_csv(tmp_path / "sjis.csv", rows, encoding="shift_jis")
    with pytest.raises(DataError, match="Shift-JIS"):
        load_pairs(path)


def test_korean_cp949_with_rare_syllables_and_hanja_still_reads(tmp_path):
    rows = [*TINY_PAIRS[:20], ("똠방각하 햏", "韓國語 漢字도 읽어요.", 0)]  # 똠/햏: cp949-only syllables
    pairs, report = load_pairs(write_csv(tmp_path / "excel.csv", rows, encoding="cp949"))
    assert report.encoding == "cp949" and pairs[-1] == QAPair("똠방각하 햏", "韓國語 漢字도 읽어요.", 0)


@pytest.mark.parametrize("content", [
    'Q,A\n안녕,"반가워요\n밥 먹었어?,네 먹었어요\n잘 자,좋은 꿈 꾸세요\n',  # never closed
    'Q,A\n안녕,"반가워요\n밥 먹었어?,네 먹었어요\n잘 자,"좋은 꿈" 꾸세요\n',  # closed rows later
])
def test_a_stray_opening_quote_is_refused_with_its_line_not_swallowing_rows(tmp_path, content):
    path = tmp_path / "stray.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=r"stray.csv:2: .*quote"):
        load_pairs(path)


def test_a_quoted_answer_over_two_lines_still_reads(tmp_path):
    path = tmp_path / "multiline.csv"
    path.write_text('Q,A\n안녕,"반가워요\n또 만나요"\n잘 자,좋은 꿈\n', encoding="utf-8")
    pairs, report = load_pairs(path)
    assert [p.answer for p in pairs] == ["반가워요 또 만나요", "좋은 꿈"] and report.rows_read == 2


def test_questions_longer_than_the_model_answers_are_dropped_and_named_in_the_report(tmp_path):
    """`Chatbot.reply` refuses a question over MAX_QUESTION_CHARS, so training on one would fail when the
    epoch's replies are scored (and again on every resume): the loader drops it before any training."""
    from chatbot.config import MAX_QUESTION_CHARS

    rows = [*TINY_PAIRS[:3], ("가" * (MAX_QUESTION_CHARS + 1), "너무 길어요.", 0), TINY_PAIRS[3]]
    pairs, report = load_pairs(write_csv(tmp_path / "long.csv", rows))
    assert [p.question for p in pairs] == [q for q, _, _ in TINY_PAIRS[:4]]
    assert report.dropped_too_long == [5]  # the CSV line, header being line 1
    assert "dropped, Q too long  1 (rows 5)" in str(report)
    edge = write_csv(tmp_path / "edge.csv", [("가" * MAX_QUESTION_CHARS, "딱 맞아요.", 0)])
    assert len(load_pairs(edge)[0]) == 1
