"""Reading a Korean Q&A CSV into clean question/answer pairs.

Owns: encoding detection (UTF-8, UTF-8 with BOM, cp949/euc-kr), column aliases, label cleanup,
dropping and counting unusable rows, the deterministic split by question, and the data report.
A user mistake raises `DataError` naming the file, the row and the reason.
Must not know about token ids or tensors.
"""

from __future__ import annotations

import csv
import io
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from chatbot.config import CONTEXT_TURNS, MAX_QUESTION_CHARS
from chatbot.data.text import normalize, normalize_turns, with_contexts

ENCODINGS = ("utf-8-sig", "cp949")  # utf-8-sig also reads plain UTF-8; cp949 is a superset of euc-kr
# Bytes of other double-byte code pages often decode as cp949 too: Shift-JIS kana and kanji mostly land
# on cp949's extension area (the 8,822 rare Hangul syllables outside KS X 1001, e.g. "귗" for "こ"),
# while Korean text saved as cp949/euc-kr by Excel is almost all in KS X 1001 (the 2,350 common
# syllables, jamo, hanja, symbols). So a cp949 reading is trusted only if at least this share of its
# distinct non-ASCII characters is in KS X 1001: two cp949 bytes, both 0xA1 or above. (Not "encodes as
# euc-kr": Python's euc-kr codec also writes the rare syllables, as eight-byte jamo sequences.)
MIN_KS_X_1001_SHARE = 0.9
VALID_LABELS = (0, 1, 2)  # 0 everyday, 1 sad/breakup/negative, 2 love/positive
COLUMN_ALIASES = {
    "question": ("q", "question", "questions", "query", "input", "질문"),
    "answer": ("a", "answer", "answers", "response", "reply", "output", "답변", "대답"),
    "label": ("label", "labels", "tone", "라벨", "감정"),
    "dialogue": ("dialogue", "dialog", "conversation", "대화"),
    "speaker": ("speaker", "role", "화자"),
    "text": ("text", "message", "utterance", "content", "발화", "내용"),
}
SPEAKERS = {"user": ("user", "human", "사용자", "질문"), "bot": ("bot", "assistant", "챗봇", "답변")}


class DataError(ValueError):
    """A problem with the user's data, reported as `file[:row]: reason`."""

    def __init__(self, path, reason: str, row: int | None = None):
        self.path, self.reason, self.row = str(path), reason, row
        where = self.path if row is None else f"{self.path}:{row}"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class QAPair:
    question: str
    answer: str
    label: int | None = None


@dataclass
class DataReport:
    path: str
    encoding: str = ""
    rows_read: int = 0
    used: int = 0
    dropped_empty: list[int] = field(default_factory=list)  # CSV line numbers
    dropped_duplicates: list[int] = field(default_factory=list)
    dropped_too_long: list[int] = field(default_factory=list)  # questions the model refuses to answer
    labels_cleared: list[int] = field(default_factory=list)  # rows whose label was not 0/1/2
    label_counts: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        def rows(numbers):
            shown = ", ".join(map(str, numbers[:5]))
            return f" (rows {shown}{', ...' if len(numbers) > 5 else ''})" if numbers else ""

        labels = ", ".join(f"{k}: {v}" for k, v in sorted(self.label_counts.items(), key=str))
        return [
            f"data: {self.path} ({self.encoding})",
            f"  rows read            {self.rows_read}",
            f"  pairs used           {self.used}",
            f"  dropped, empty Q/A   {len(self.dropped_empty)}{rows(self.dropped_empty)}",
            f"  dropped, duplicate   {len(self.dropped_duplicates)}{rows(self.dropped_duplicates)}",
            f"  dropped, Q too long  {len(self.dropped_too_long)}{rows(self.dropped_too_long)} "
            f"(over {MAX_QUESTION_CHARS:,} characters, more than a question may have)",
            f"  labels not 0/1/2     {len(self.labels_cleared)}{rows(self.labels_cleared)} (kept without label)",
            f"  labels               {labels or 'none'}",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _decode(path: Path, raw: bytes) -> tuple[str, str]:
    for encoding in ENCODINGS:
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError:
            continue
        if encoding == "cp949" and not _looks_like_korean(text):
            break
        return text, ("utf-8" if encoding == "utf-8-sig" and not raw.startswith(b"\xef\xbb\xbf") else encoding)
    raise DataError(path, "cannot decode the file as UTF-8 or Korean cp949/euc-kr (Shift-JIS or another code "
                          "page?); save it as UTF-8 CSV")


def _looks_like_korean(text: str) -> bool:
    """See MIN_KS_X_1001_SHARE."""
    wide = [char for char in set(text) if ord(char) > 0x7F]
    common = sum(1 for char in wide if min(char.encode("cp949")) >= 0xA1)  # the text came from cp949: it encodes
    return not wide or common >= MIN_KS_X_1001_SHARE * len(wide)


def _find_column(path: Path, columns: list[str], role: str, required: bool) -> int | None:
    """The index of the first header cell that names `role`."""
    lowered = {}
    for index, name in enumerate(columns):
        lowered.setdefault(name.strip().lower(), index)
    for alias in COLUMN_ALIASES[role]:
        if alias in lowered:
            return lowered[alias]
    if required:
        names = "/".join(COLUMN_ALIASES[role][:3])
        raise DataError(path, f"no {role} column (expected one of {names}); found columns: {', '.join(columns)}", row=1)
    return None


def _clean_label(value) -> int | None:
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return int(number) if number.is_integer() and int(number) in VALID_LABELS else None


def _check_multiline(path: Path, lines: list[str], fields: list[str], start: int) -> None:
    """A quoted field may span lines, but a stray opening quote also makes one: it swallows the rows
    after it into one field, silently. Refuse a record whose quotes do not pair up (the quote was never
    closed) or whose field spans lines that read like rows of their own (a comma on them)."""
    if sum(line.count('"') for line in lines) % 2:
        raise DataError(path, "a quote opened here is never closed, so every row after it would be read as "
                              "one field (remove the stray quote or close it)", row=start)
    for field in fields:
        continued = field.split("\n")[1:]
        if any("," in part for part in continued):
            raise DataError(path, f"a quoted field runs over {len(continued) + 1} lines that look like rows of "
                                  f"their own; an opening quote is probably unmatched", row=start)


def read_records(path: str | Path) -> tuple[list[str], list[tuple[int, list[str]]], str]:
    """The header, every data row as (CSV line where it starts, fields) and the encoding. Blank lines are
    skipped but counted, and a quoted field may span lines, so the numbers are the lines an editor shows.
    Read with the csv module, not pandas: pandas silently took the first column as the index when the
    first data row had one field more than the header, shifting every column. Raises DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "file not found" if not path.exists() else "not a file")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(path, "the file is empty")
    text, encoding = _decode(path, raw)
    reader = csv.reader(io.StringIO(text, newline=""))
    text_lines = io.StringIO(text, newline="").readlines()  # the lines `reader.line_num` counts
    header, records, last_line = None, [], 0
    try:
        for fields in reader:
            start, last_line = last_line + 1, reader.line_num
            if not any(cell.strip() for cell in fields):
                continue
            if last_line > start:
                _check_multiline(path, text_lines[start - 1:last_line], fields, start)
            if header is None:
                header = fields
            elif len(fields) > len(header) and any(cell.strip() for cell in fields[len(header):]):
                raise DataError(path, f"{len(fields)} fields but the header has {len(header)} (quote a field "
                                      f"that contains a comma)", row=start)
            else:
                records.append((start, fields[:len(header)] + [""] * (len(header) - len(fields))))
    except csv.Error as error:
        raise DataError(path, f"not a readable CSV ({error})", row=reader.line_num) from None
    if header is None:
        raise DataError(path, "the file has no header row")
    return header, records, encoding


def read_rows(path: str | Path) -> tuple[list[tuple[int, str, str, object]], str]:
    """Every data row as (CSV line, question, answer, raw label or None), uncleaned, and the encoding. A file of
    dialogues (columns dialogue, speaker, text) gives a row per reply (`dialogue_rows`)."""
    header, records, encoding = read_records(path)
    path = Path(path)
    if _find_column(path, header, "dialogue", required=False) is not None:
        return dialogue_rows(path, header, records), encoding
    q_col = _find_column(path, header, "question", required=True)
    a_col = _find_column(path, header, "answer", required=True)
    label_col = _find_column(path, header, "label", required=False)
    return [(line, fields[q_col], fields[a_col], None if label_col is None else fields[label_col])
            for line, fields in records], encoding


def dialogue_rows(path: Path, header: list[str], records) -> list[tuple[int, str, str, None]]:
    """A dialogue file's rows (dialogue id, speaker user or bot, text; a dialogue's messages in order) as
    question/answer rows: every bot message right after a user message answers it, and its question carries the
    CONTEXT_TURNS messages before that user message, written as decoding writes a conversation
    (`chatbot.data.text.with_context`), so the model learns to read it. Raises DataError for another speaker."""
    columns = [_find_column(path, header, role, required=True) for role in ("dialogue", "speaker", "text")]
    names = {alias: speaker for speaker, aliases in SPEAKERS.items() for alias in aliases}
    rows, asked, messages, current = [], [], [], None
    for line, fields in records:
        dialogue, speaker, text = (fields[column] for column in columns)
        speaker = names.get(speaker.strip().lower())
        if speaker is None:
            raise DataError(path, f"speaker {fields[columns[1]]!r}: expected user or bot", row=line)
        if dialogue != current:
            messages, current = [], dialogue
        if speaker == "bot" and messages and messages[-1][0] == "user":
            rows.append((line, text))
            asked.append((messages[-1][1], [message for _, message in messages[:-1]]))
        messages.append((speaker, normalize(text)))
    questions = with_contexts([q for q, _ in asked], [earlier for _, earlier in asked], CONTEXT_TURNS) if asked else []
    return [(line, question, text, None) for (line, text), question in zip(rows, questions)]


def clean_rows(source: str | Path, rows, encoding: str, *,
               keep_duplicates: bool = False) -> tuple[list[QAPair], DataReport]:
    """Clean, de-duplicated pairs from (line, question, answer, raw label or None) rows, and a report
    of what was dropped and why. `source` names the data in the report and in errors."""
    report = DataReport(path=str(source), encoding=encoding)
    pairs, seen = [], set()
    for line, question, answer, raw_label in rows:
        report.rows_read += 1
        question, answer = normalize_turns(question), normalize(answer)
        if not question or not answer:
            report.dropped_empty.append(line)
            continue
        if len(question) > MAX_QUESTION_CHARS:  # `Chatbot.reply` refuses it: validation and eval would fail
            report.dropped_too_long.append(line)
            continue
        if (question, answer) in seen and not keep_duplicates:
            report.dropped_duplicates.append(line)
            continue
        seen.add((question, answer))
        label = None if raw_label is None else _clean_label(raw_label)
        if raw_label is not None and label is None:
            report.labels_cleared.append(line)
        pairs.append(QAPair(question, answer, label))

    report.used = len(pairs)
    report.label_counts = dict(Counter("none" if p.label is None else p.label for p in pairs))
    if not pairs:
        raise DataError(source, f"no usable rows: all {report.rows_read} rows have an empty question or answer, "
                                f"or a question over {MAX_QUESTION_CHARS:,} characters")
    return pairs, report


def load_pairs(path: str | Path) -> tuple[list[QAPair], DataReport]:
    """Load clean, de-duplicated pairs and a report of what was dropped and why."""
    rows, encoding = read_rows(path)
    return clean_rows(path, rows, encoding)


def merge_pairs(pair_lists: list[list[QAPair]]) -> tuple[list[QAPair], int]:
    """Pairs of several files in order, each (question, answer) once. Returns them and how many
    pairs repeated one of an earlier file."""
    merged, seen = [], set()
    for pairs in pair_lists:
        for pair in pairs:
            if (pair.question, pair.answer) not in seen:
                seen.add((pair.question, pair.answer))
                merged.append(pair)
    return merged, sum(map(len, pair_lists)) - len(merged)


def split_by_question(pairs: list[QAPair], val_fraction: float, seed: int) -> tuple[list[QAPair], list[QAPair]]:
    """Deterministic split in which all pairs of one question land on the same side."""
    questions = sorted({p.question for p in pairs})
    random.Random(seed).shuffle(questions)
    n_val = int(round(len(questions) * val_fraction))
    n_val = min(n_val, len(questions) - 1)  # always keep something to train on
    held_out = set(questions[:n_val])
    train = [p for p in pairs if p.question not in held_out]
    val = [p for p in pairs if p.question in held_out]
    return train, val
