"""The bundled Korean sets in data/: they load cleanly, are original, and are fit to train the default model on."""

import csv
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from chatbot.data.pairs import load_pairs
from conftest import SHARED_CHATBOT_DATA

DATA = Path(__file__).resolve().parent.parent / "data"
BUNDLED = [DATA / "korean_chat.csv", *sorted(DATA.glob("chat_*.csv"))]  # not data/examples/, nor a downloaded ChatbotData.csv
SITUATION_FILES = [path for path in BUNDLED if path.name.startswith("chat_")]
MAX_LENGTH = 40  # ModelConfig's default
PERSONAL = re.compile(r"[\w.+-]+@[\w-]+\.\w+|\d{2,3}-\d{3,4}-\d{4}|\d{6}-[1-4]\d{6}")


@pytest.fixture(scope="module")
def loaded():
    pairs, reports = [], []
    for path in BUNDLED:
        file_pairs, report = load_pairs(path)
        pairs += file_pairs
        reports.append(report)
    return pairs, reports


@pytest.fixture(scope="module")
def rows():
    """Every file's rows as the csv module reads them (header names as written)."""
    return {path.name: list(csv.DictReader(open(path, encoding="utf-8", newline=""))) for path in BUNDLED}


def test_every_file_is_utf8_with_the_header_and_loads_with_nothing_dropped(loaded):
    for path in BUNDLED:
        text = path.read_bytes().decode("utf-8")  # raises on anything but UTF-8
        assert not text.startswith("\ufeff") and text.splitlines()[0].split(",")[:3] == ["Q", "A", "label"]
    for report in loaded[1]:
        assert report.rows_read == report.used
        assert not report.dropped_empty and not report.dropped_duplicates and not report.labels_cleared


def test_at_least_15000_pairs_and_every_question_once(loaded):
    pairs, _ = loaded
    assert len(pairs) >= 15000
    assert len({p.question for p in pairs}) == len(pairs)  # one answer per question, across all files


def test_answers_are_varied_yet_shared_by_paraphrases(loaded):
    pairs, _ = loaded
    per_answer = Counter(p.answer for p in pairs)
    assert len(per_answer) >= 0.4 * len(pairs)
    # Many answers serve two or more phrasings; the rest fit one question only (a question that asks a little
    # more than its situation's others gets its own answer rather than one that misses it).
    assert sum(count >= 2 for count in per_answer.values()) >= 0.4 * len(per_answer)


def test_every_label_is_valid_and_at_least_a_fifth(loaded):
    pairs, _ = loaded
    labels = Counter(p.label for p in pairs)
    assert set(labels) == {0, 1, 2}
    assert all(count >= 0.2 * len(pairs) for count in labels.values()), labels


def test_situations_have_several_phrasings_and_answers(rows):
    """A situation split where its phrasings state different feelings ("빨래 쉰내 (냄새 제거 방법)" beside "빨래 쉰내")
    is still one situation here: the split only gives a few phrasings their own label."""
    situations = defaultdict(lambda: (set(), set()))
    for name in (path.name for path in SITUATION_FILES):
        for row in rows[name]:
            questions, answers = situations[(name, row["situation"].split(" (")[0])]
            questions.add(row["Q"])
            answers.add(row["A"])
    assert len(situations) >= 800
    thin = [key for key, (questions, answers) in situations.items() if len(questions) < 3 or len(answers) < 2]
    assert len(thin) <= 0.01 * len(situations), thin[:10]


def test_no_personal_data(loaded):
    pairs, _ = loaded
    assert not [p for p in pairs if PERSONAL.search(p.question) or PERSONAL.search(p.answer)]


def test_every_pair_fits_max_length_after_tokenization(loaded):
    from chatbot.tokenizer.subword import Tokenizer

    pairs, _ = loaded
    texts = [p.question for p in pairs] + [p.answer for p in pairs]
    tokenizer = Tokenizer.train(texts, 4000)
    lengths = tokenizer.tokenize(texts).row_lengths().numpy()
    assert lengths.max() + 2 <= MAX_LENGTH  # with the start and end tokens


def test_questions_are_written_as_people_type(loaded):
    pairs, _ = loaded
    questions = [p.question for p in pairs]
    assert sum("ㅋ" in q or "ㅠ" in q or "ㅎ" in q for q in questions) >= 200
    assert sum(q.endswith("요") or q.endswith("요?") for q in questions) >= 0.15 * len(questions)  # polite
    assert sum(len(q) <= 6 for q in questions) >= 0.05 * len(questions)  # short, as typed
    assert sum(len(q) >= 15 for q in questions) >= 0.15 * len(questions)  # with a reason or context


def _bigrams(text: str) -> Counter:
    return Counter(text[i:i + 2] for i in range(len(text) - 1))


def _cosine(a: Counter, b: Counter) -> float:
    if not a or not b:
        return float(a == b)
    dot = sum(count * b[gram] for gram, count in a.items())
    return dot / math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))


@pytest.mark.slow  # every bundled question against every public one that shares a bigram
def test_at_most_half_a_percent_of_pairs_near_a_public_chatbotdata_row(loaded):
    """Written for this project: a pair whose question and answer are both within character-bigram cosine 0.9
    of one public ChatbotData row is a near copy. Short common exchanges ("새해 복 많이 받아") may coincide."""
    if not SHARED_CHATBOT_DATA.is_file():
        pytest.skip("../shared/data/ChatbotData.csv is not here")
    public = [(row["Q"], row["A"]) for row in csv.DictReader(open(SHARED_CHATBOT_DATA, encoding="utf-8"))]
    grams = [_bigrams(q) for q, _ in public]
    norms = np.array([math.sqrt(sum(v * v for v in g.values())) for g in grams])
    postings = defaultdict(list)
    for row, counts in enumerate(grams):
        for gram, count in counts.items():
            postings[gram].append((row, count))
    postings = {gram: (np.array([r for r, _ in rows]), np.array([c for _, c in rows], float))
                for gram, rows in postings.items()}

    def near(question: str, answer: str) -> bool:
        counts, dots = _bigrams(question), np.zeros(len(public))
        for gram, count in counts.items():
            if gram in postings:
                rows, others = postings[gram]
                dots[rows] += count * others  # a bigram's rows are distinct
        norm = math.sqrt(sum(v * v for v in counts.values()))
        return any(_cosine(_bigrams(answer), _bigrams(public[row][1])) >= 0.9
                   for row in np.flatnonzero((dots > 0) & (dots >= 0.9 * norm * norms)))

    pairs, _ = loaded
    copies = [(p.question, p.answer) for p in pairs if near(p.question, p.answer)]
    assert len(copies) <= 0.005 * len(pairs), copies[:20]


def _near_identical(question: str) -> str:
    """A question without what does not change what it asks: spaces, punctuation, ㅋ/ㅎ/ㅠ/ㅜ runs and a
    polite ending (요, and its typed forms 용/여)."""
    question = re.sub(r"[ㅋㅎㅠㅜ]+", "", question)
    question = re.sub(r"[^\w]", "", question)
    return re.sub(r"(요|용|여)$", "", question)


def test_near_identical_questions_never_carry_different_labels(rows):
    """One labelling scheme across every file (data/README.md): "살 빠졌어" and "살 빠졌어!" are one message."""
    labels = defaultdict(set)
    for name, file_rows in rows.items():
        for row in file_rows:
            labels[_near_identical(row["Q"])].add((row["label"], f"{name}: {row['Q']}"))
    split = {key: sorted(found) for key, found in labels.items() if len({label for label, _ in found}) > 1}
    assert not split, list(split.values())[:10]


def test_a_situation_has_one_label(rows):
    """Its questions are paraphrases of one message, so they share the feeling a label names."""
    labels = defaultdict(set)
    for path in SITUATION_FILES:
        for row in rows[path.name]:
            labels[(path.name, row["situation"])].add(row["label"])
    assert not [key for key, found in labels.items() if len(found) > 1]


def test_no_question_is_just_its_situations_title_and_no_answer_says_dangsin(rows):
    """Nobody types "새 분야 적성 발견"; "당신" reads like a translation in a friendly reply."""
    for path in SITUATION_FILES:
        assert not [row["Q"] for row in rows[path.name] if row["Q"].strip() == row["situation"].strip()]
    assert not [row["A"] for file_rows in rows.values() for row in file_rows if "당신" in row["A"]]


def test_the_data_cards_numbers_are_the_files_own(rows):
    """data/README.md's counts are read off the files: an edit that changes them fails here until the card says so."""
    card = (DATA / "README.md").read_text(encoding="utf-8")

    def said(number: int) -> str:
        return f"{number:,}"

    korean = rows["korean_chat.csv"]
    assert f"Number of pairs: **{said(len(korean))}**" in card
    assert f"Distinct answers: **{said(len({r['A'] for r in korean}))}**" in card
    for label, count in Counter(r["label"] for r in korean).items():
        assert re.search(rf"^\| {label} \|.*\| {said(count)} \(", card, re.M), label
    situation_rows = [row for path in SITUATION_FILES for row in rows[path.name]]
    for path in SITUATION_FILES:
        file_rows = rows[path.name]
        situations = len({row["situation"] for row in file_rows})
        assert re.search(rf"^\| `{path.name}` \|.*\| {said(situations)} \| {said(len(file_rows))} \|$", card, re.M), path.name
    every = [row for file_rows in rows.values() for row in file_rows]
    assert f"All bundled data together ({said(len(every))} pairs)" in card
    assert (f"Distinct answers: {said(len({r['A'] for r in situation_rows}))} of {said(len(situation_rows))} "
            f"(all bundled data: {said(len({r['A'] for r in every}))} of {said(len(every))})") in card


DIALOGUES = sorted((DATA / "dialogues").glob("*.csv"))
FOLLOW_UP = re.compile(r"^(응|어|아니|ㅇㅇ|ㄴㄴ|ㅇㅋ|왜|그래서|진짜|정말|몰라|그럼|어떻게|고마워|그치|헐|대박)|그거|거기|그걸|그때|그 사람|그건")


@pytest.fixture(scope="module")
def dialogues():
    """Each dialogue's messages as (speaker, text), in order, by file."""
    found = {}
    for path in DIALOGUES:
        assert path.read_bytes().decode("utf-8").splitlines()[0] == "dialogue,speaker,text"
        for row in csv.DictReader(open(path, encoding="utf-8", newline="")):
            found.setdefault((path.name, row["dialogue"]), []).append((row["speaker"], row["text"]))
    return found


def test_at_least_3000_dialogues_of_two_to_four_exchanges_user_first_bot_last(dialogues):
    assert len(DIALOGUES) >= 6 and len(dialogues) >= 3000
    for key, messages in dialogues.items():
        assert len(messages) in (4, 6, 8), key
        assert [speaker for speaker, _ in messages] == ["user", "bot"] * (len(messages) // 2), key
        assert all(text.strip() for _, text in messages), key
    lengths = Counter(len(messages) for messages in dialogues.values())
    assert all(lengths[n] >= 0.1 * len(dialogues) for n in (4, 6, 8)), lengths


def test_dialogues_are_distinct_and_open_in_many_ways(dialogues):
    conversations = [tuple(messages) for messages in dialogues.values()]
    assert len(set(conversations)) == len(conversations)
    openings = Counter(messages[0][1] for messages in conversations)
    assert len(openings) >= 0.95 * len(conversations), openings.most_common(5)


def test_follow_ups_lean_on_what_came_before(dialogues):
    """The dialogues teach reading the conversation: many follow-ups are short replies or point back (응, 왜?,
    그거, 거기), which only the earlier turns explain."""
    follow_ups = [text for messages in dialogues.values() for speaker, text in messages[2:] if speaker == "user"]
    leaning = [text for text in follow_ups if FOLLOW_UP.search(text) or len(text.replace(" ", "")) <= 4]
    assert len(leaning) >= 0.4 * len(follow_ups), len(leaning) / len(follow_ups)


def test_the_bot_speaks_politely_and_never_says_dangsin(dialogues):
    bot = [text for messages in dialogues.values() for speaker, text in messages if speaker == "bot"]
    assert not [text for text in bot if "당신" in text]
    casual = [text for text in bot if re.search(r"(겠다|구나|좋다|이다|했어|해봐)[!.?~]*$", text)]
    assert len(casual) <= 0.01 * len(bot), casual[:10]


def test_no_dialogue_exchange_is_a_public_chatbotdata_row(dialogues):
    if not SHARED_CHATBOT_DATA.is_file():
        pytest.skip("../shared/data/ChatbotData.csv is not here")
    public = {(_near_identical(row["Q"]), _near_identical(row["A"]))
              for row in csv.DictReader(open(SHARED_CHATBOT_DATA, encoding="utf-8"))}
    exchanges = [(_near_identical(messages[i][1]), _near_identical(messages[i + 1][1]))
                 for messages in dialogues.values() for i in range(0, len(messages), 2)]
    copied = [pair for pair in exchanges if pair in public]
    assert len(copied) <= 0.001 * len(exchanges), copied[:10]


def test_the_dialogue_cards_numbers_are_the_files_own(dialogues):
    card = (DATA / "README.md").read_text(encoding="utf-8")
    lengths = Counter(len(messages) for messages in dialogues.values())
    messages = sum(lengths[n] * n for n in lengths)
    assert (f"{len(dialogues):,} dialogues, {messages:,} messages ({lengths[4]:,} of 4 messages, "
            f"{lengths[6]:,} of 6, {lengths[8]:,} of 8)") in card
