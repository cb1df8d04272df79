"""The hands-on notebook: the learner writes every layer, and each one matches the package's own layer.

Besides the layers: label smoothing in the loss (checked against the package's loss with the same ε), an evaluation of
the learner's own model on held-out questions (chrF, unique-reply ratio), exercises with folded answers from chapter 3
on, a summary at the end of each chapter and a glossary at the end.

The run uses the notebook's fast settings (CHATBOT_NOTEBOOK_FAST=1: a tiny model, a few training steps) on CPU,
with `notebooks/` as the working directory, as a reader opening it in Jupyter would have. The committed file holds
the outputs of a full run; the checks it printed there are read too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from notebook_run import (START_UP_NOISE, chapter_headings, chapters, check_glossary, code_cells, run_fast, stderr_of,  # noqa: E402
                          tagged, text_of)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "transformer_tutorial.ipynb"
CELL_TIMEOUT_S = 240
# The fast run takes about 30 s on two shared cores (as the notebook says; more room here for a busy machine), the full
# run the committed outputs come from about a minute and three quarters (the notebook promises at most four minutes).
FAST_RUN_BUDGET_S = 90
FULL_RUN_BUDGET_S = 240
# A word each chapter heading must hold, in this order.
CHAPTERS = ("준비", "토크나이저", "위치 인코딩", "마스크", "어텐션", "멀티 헤드", "인코더", "디코더", "트랜스포머", "손실",
            "디코딩", "평가", "정리")
# The checks against the package the notebook must print (name as printed, before the colon).
REQUIRED_CHECKS = (
    "positional_encoding(50, 128)", "PositionalEmbedding", "padding_mask", "look_ahead_mask(6)", "causal_mask",
    "MultiHeadAttention, 자기 어텐션 출력", "MultiHeadAttention, 교차 어텐션 출력", "EncoderLayer (추론 모드)",
    "DecoderLayer 출력 (추론 모드)", "Transformer 로짓 (추론 모드)", "masked_cross_entropy", "WarmupSchedule(128, 4000)",
    "masked_cross_entropy, 레이블 스무딩 ε=0.0", "masked_cross_entropy, 레이블 스무딩 ε=0.1",
    "chrF = chatbot.training.evaluate.reply_metrics", "고유 답 비율 = chatbot.training.evaluate.reply_metrics",
)
LABEL_SMOOTHING_CHECK = "masked_cross_entropy, 레이블 스무딩 ε=0.1"
EXERCISE = re.compile(r"^### 연습 (\d+)\.(\d+) — \S")
FOLDED_ANSWER = re.compile(r"<details><summary>정답 보기</summary>\n\n(.+?)\n\n</details>", re.S)
# Terms the glossary must explain, each on its own line (as the glossary spells them).
GLOSSARY_TERMS = ("임베딩", "위치 인코딩", "어텐션", "쿼리/키/값", "멀티 헤드 어텐션", "마스크", "잔차 연결", "층 정규화", "피드포워드",
                  "교차 엔트로피", "레이블 스무딩", "워밍업", "Adam", "노름", "원-핫", "로짓", "소프트맥스", "탐욕 디코딩", "chrF",
                  "BLEU", "고유 답 비율", "블라인드 사람 평가", "교사 강요", "과적합", "드롭아웃", "학습률")
WIKIDOCS_BOOK = ("딥 러닝을 이용한 자연어 처리 입문", "https://wikidocs.net/book/2155")
WIKIDOCS_CHATBOT = ("트랜스포머를 이용한 한국어 챗봇", "https://wikidocs.net/89786")
TF_TUTORIAL = ("Neural machine translation with a Transformer and Keras", "https://www.tensorflow.org/text/tutorials/transformer")
CHECK_LINE = re.compile(r"^확인 \| (.+?): 최대 \|차이\| = (\S+) \(허용 (\S+)\) (\S+)$", re.M)
# What the learner writes: each must be defined in a code cell, never imported.
DEFINED = {
    "positional_encoding": r"^def positional_encoding\(",
    "padding_mask": r"^def padding_mask\(",
    "look_ahead_mask": r"^def look_ahead_mask\(",
    "causal_mask": r"^def causal_mask\(",
    "scaled_dot_product_attention": r"^def scaled_dot_product_attention\(",
    "PositionalEmbedding": r"^class PositionalEmbedding\(keras\.layers\.Layer\):",
    "MultiHeadAttention": r"^class MultiHeadAttention\(keras\.layers\.Layer\):",
    "EncoderLayer": r"^class EncoderLayer\(keras\.layers\.Layer\):",
    "DecoderLayer": r"^class DecoderLayer\(keras\.layers\.Layer\):",
    "Transformer": r"^class Transformer\(keras\.Model\):",
    "masked_cross_entropy": r"^def masked_cross_entropy\(",
    "WarmupSchedule": r"^class WarmupSchedule\(keras\.optimizers\.schedules\.LearningRateSchedule\):",
    "greedy_reply": r"^def greedy_reply\(",
    "greedy_replies": r"^def greedy_replies\(",
}
EXECUTION = {}  # seconds the executed fixture's run took


def checks_of(notebook) -> list[tuple[str, float, float, str]]:
    """Every printed check: (name, max |difference|, tolerance, verdict)."""
    return [(name, float(difference), float(tolerance), verdict)
            for cell in code_cells(notebook) for name, difference, tolerance, verdict in CHECK_LINE.findall(text_of(cell))]


def calls_to_check(source: str) -> int:
    return len(re.findall(r"^\s*check\(", source, re.M))


def assert_checks_pass(notebook):
    checks = checks_of(notebook)
    names = {name for name, *_ in checks}
    assert not set(REQUIRED_CHECKS) - names, f"checks not printed: {set(REQUIRED_CHECKS) - names}"
    for name, difference, tolerance, verdict in checks:
        assert difference < tolerance, f"{name}: max |diff| {difference} is not below {tolerance}"
        assert verdict == "통과", name
    for cell in code_cells(notebook):  # a cell that calls check() prints a line for each call (a loop prints more)
        assert len(CHECK_LINE.findall(text_of(cell))) >= calls_to_check(cell.source), cell.source[:80]


@pytest.fixture(scope="module")
def source_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook executed once in fast mode (`notebook_run.run_fast`)."""
    notebook, EXECUTION["seconds"] = run_fast(NOTEBOOK, tmp_path_factory.mktemp("jupyter"), CELL_TIMEOUT_S)
    return notebook


def test_chapters_are_numbered_in_order(source_notebook):
    headings = chapter_headings(source_notebook)
    assert [int(re.match(r"## (\d+)\.", heading).group(1)) for heading in headings] == list(range(1, len(CHAPTERS) + 1))
    for heading, word in zip(headings, CHAPTERS):
        assert word in heading, f"{heading!r} should be the chapter about {word!r}"


def test_the_learner_writes_the_layers_instead_of_importing_them(source_notebook):
    source = "\n".join(cell.source for cell in code_cells(source_notebook))
    for name, definition in DEFINED.items():
        assert re.search(definition, source, re.M), f"the notebook must define {name} itself"
        assert not re.search(rf"^from chatbot\S* import .*\b{name}\b", source, re.M), f"{name} is imported"
    assert re.search(r"^from chatbot.model import layers as pkg\b", source, re.M)  # the package as the answer key, a module
    classes = re.findall(r"^class (\w+)\((?:keras\.layers\.Layer|keras\.Model)\):", source, re.M)
    assert len(classes) == 5
    for name in classes:  # each layer is serializable: its class body defines get_config
        body = re.search(rf"^class {name}\(.*?(?=^\S)", source + "\nEND", re.M | re.S).group(0)
        assert "def get_config(self)" in body, f"{name} has no get_config"
    assert "ops.softmax" in source and "ops.matmul" in source  # the layer code uses keras.ops


def test_committed_outputs_come_from_a_full_run(source_notebook):
    """Browsing the repository shows the checks, plots and replies without running anything."""
    assert all(cell.execution_count for cell in code_cells(source_notebook))
    recorded = text_of(tagged(source_notebook, "run-time"))
    match = re.search(r"실행 시간: (\d+)초", recorded)
    assert match and "빠른 모드" not in recorded, "the committed outputs must come from a full (not fast) run"
    seconds = int(match.group(1))
    assert seconds <= FULL_RUN_BUDGET_S
    stated = re.search(r"약 (\d+)분(?: (\d+)초)?", source_notebook.cells[0].source)
    assert stated, "the introduction states the run time"
    assert abs(60 * int(stated.group(1)) + int(stated.group(2) or 0) - seconds) <= 30, (stated.group(0), seconds)
    assert_checks_pass(source_notebook)
    images = sum("image/png" in output.get("data", {}) for cell in code_cells(source_notebook) for output in cell.outputs)
    assert images >= 6
    assert not START_UP_NOISE.search(stderr_of(source_notebook))


@pytest.mark.slow  # executes the notebook
def test_fast_run_has_no_errors_and_stays_quiet(executed):
    errors = [output for cell in code_cells(executed) for output in cell.outputs if output.output_type == "error"]
    assert not errors
    assert not START_UP_NOISE.search(stderr_of(executed))
    assert EXECUTION["seconds"] <= FAST_RUN_BUDGET_S, f"the fast run took {EXECUTION['seconds']:.0f} s"
    assert "빠른 모드" in text_of(tagged(executed, "run-time"))


@pytest.mark.slow  # executes the notebook
def test_every_layer_matches_the_package(executed):
    assert_checks_pass(executed)


@pytest.mark.slow  # executes the notebook
def test_the_learners_model_trains_and_replies(executed):
    replies = text_of(tagged(executed, "replies"))
    assert replies.count("모델:") == 8
    losses = re.search(r"처음 손실 ([\d.]+) .*→ 마지막 20 스텝 평균 ([\d.]+)", text_of(tagged(executed, "training")))
    assert losses and float(losses.group(2)) < float(losses.group(1)), "a few steps of Adam lower the loss"


def evaluation_numbers(notebook) -> tuple[float, float]:
    """(chrF, unique-reply ratio) the evaluation cell printed for the learner's model on the held-out questions."""
    printed = text_of(tagged(notebook, "evaluation"))
    assert "이 노트북의 Transformer" in printed, "the evaluation must be of the notebook's own model"
    match = re.search(r"처음 보는 질문 (\d+)개: chrF = (\d+\.\d), 고유 답 비율 = ([\d.]+)", printed)
    assert match, "the evaluation cell prints a chrF number"
    assert int(match.group(1)) == 64
    chrf, unique = float(match.group(2)), float(match.group(3))
    assert 0.0 <= chrf <= 100.0 and 0.0 < unique <= 1.0
    return chrf, unique


def assert_label_smoothing_matches(notebook):
    smoothed = [(difference, tolerance) for name, difference, tolerance, _ in checks_of(notebook)
                if name == LABEL_SMOOTHING_CHECK]
    assert len(smoothed) == 1, "the label-smoothing check against the package is printed once"
    difference, tolerance = smoothed[0]
    assert difference < tolerance


def test_label_smoothing_is_written_by_the_learner_and_matches_the_package(source_notebook):
    source = "\n".join(cell.source for cell in code_cells(source_notebook))
    assert re.search(r"^def masked_cross_entropy\(targets, logits, label_smoothing=0\.0\):", source, re.M)
    assert "MaskedSparseCrossEntropy(label_smoothing=epsilon)" in source  # the package's loss with the same ε
    assert_label_smoothing_matches(source_notebook)
    loss_chapter = "\n".join(cell.source for cell in dict(chapters(source_notebook))[10] if cell.cell_type == "markdown")
    assert "### 레이블 스무딩" in loss_chapter and "Keras" in loss_chapter and "V-1" in loss_chapter  # how implementations differ


def test_the_evaluation_follows_decoding_and_is_of_the_learners_model(source_notebook):
    evaluation = dict(chapters(source_notebook))[12]
    assert "평가" in evaluation[0].source
    assert any(tagged(source_notebook, "evaluation") is cell for cell in evaluation)
    text = "\n".join(cell.source for cell in evaluation if cell.cell_type == "markdown")
    assert "글자 n-그램" in text and "BLEU" in text and "블라인드" in text  # what chrF is, why not BLEU, what quality is
    chrf, unique = evaluation_numbers(source_notebook)
    printed = text_of(tagged(source_notebook, "evaluation"))
    assert "11장에서 한 문장씩 만든 답과 같은 답: 4/4" in printed  # batched decoding = one question at a time
    assert f"chrF는 약 {chrf:.1f}" in text and f"고유 답 비율은 {unique:.2f}" in text  # the prose quotes the committed run


def test_the_notebook_never_loads_the_projects_default_model(source_notebook):
    source = "\n".join(cell.source for cell in code_cells(source_notebook))
    for loader in ("models/default", "load_model", "chatbot.model.pretrained", "chatbot.decoding.chatbot", "Chatbot(", "from_pretrained"):
        assert loader not in source, loader
    assert "assert isinstance(model, Transformer)" in source
    assert re.findall(r"greedy_repl(?:y|ies)\((\w+),", source) and set(re.findall(r"greedy_repl(?:y|ies)\((\w+),", source)) == {"model"}


def test_every_exercise_has_a_folded_answer(source_notebook):
    numbered = chapters(source_notebook)
    assert [number for number, _ in numbered] == list(range(1, len(CHAPTERS) + 1))
    for number, cells in numbered:
        exercises = [cell for cell in cells if cell.cell_type == "markdown" and "연습" in cell.source.split("\n")[0]]
        if number >= 3:
            assert exercises, f"chapter {number} has no exercise"
        for cell in exercises:
            heading = EXERCISE.match(cell.source)
            assert heading and int(heading.group(1)) == number, cell.source[:60]
            question, _, rest = cell.source.partition("<details>")
            assert question.split("\n", 1)[1].strip(), "the exercise asks something before its answer"
            answers = FOLDED_ANSWER.findall(cell.source)
            assert len(answers) == 1 and answers[0].strip(), f"{heading.group(0)}: one folded answer"
            assert cell.source.count("<details>") == cell.source.count("</details>") == 1
            assert cell.source.rstrip().endswith("</details>")


def test_each_chapter_ends_with_a_short_summary(source_notebook):
    for number, cells in chapters(source_notebook)[:-1]:  # the last chapter is the summary itself
        last_markdown = [cell for cell in cells if cell.cell_type == "markdown"][-1]
        assert cells[-1] is last_markdown, f"chapter {number} ends with its summary"
        assert last_markdown.source.startswith("**이 장의 요점**"), f"chapter {number}"
        bullets = [line for line in last_markdown.source.splitlines() if line.startswith("* ")]
        assert 2 <= len(bullets) <= 4, f"chapter {number}: {len(bullets)} points"


def test_the_glossary_ends_the_notebook(source_notebook):
    check_glossary(source_notebook, GLOSSARY_TERMS)


def test_the_two_tutorials_are_named_and_linked_where_conventions_differ(source_notebook):
    markdown = [cell.source for cell in source_notebook.cells if cell.cell_type == "markdown"]
    introduction = markdown[0]
    for name, address in (WIKIDOCS_BOOK, WIKIDOCS_CHATBOT, TF_TUTORIAL):
        assert name in introduction and address in introduction, name
    by_chapter = {number: "\n".join(cell.source for cell in cells if cell.cell_type == "markdown")
                  for number, cells in chapters(source_notebook)}
    for chapter in (3, 4):  # the sin/cos layout, the mask convention
        assert WIKIDOCS_CHATBOT[0] in by_chapter[chapter] and TF_TUTORIAL[0] in by_chapter[chapter], chapter
    assert "seed" not in "\n".join(markdown).lower().replace("씨앗(seed)", "")


@pytest.mark.slow  # executes the notebook
def test_label_smoothing_check_passes_in_a_fresh_run(executed):
    assert_label_smoothing_matches(executed)


@pytest.mark.slow  # executes the notebook
def test_the_evaluation_prints_chrf_for_the_learners_model(executed):
    evaluation_numbers(executed)
