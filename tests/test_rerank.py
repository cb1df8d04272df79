"""The compiled decoder's reranking: the generated reply weighed against the retrieved answers."""

import numpy as np
import pytest
import tensorflow as tf

from chatbot.config import GenerationConfig
from chatbot.decoding.chatbot import Chatbot
from chatbot.decoding.request import Options
from chatbot.decoding.loop import Loop
from chatbot.decoding.prepare import Prepared
from chatbot.decoding.rerank import token_f1
from chatbot.training.best_epoch import reply_features
from chatbot.tokenizer.subword import END_ID, NUM_SPECIAL, PAD_ID, SEPARATOR_ID, START_ID
from conftest import TINY_PAIRS

QUESTIONS = [q for q, _, _ in TINY_PAIRS]
NEW_QUESTIONS = ["처음 보는 질문이에요", "배고픈데 뭐 먹지", "비가 많이 와", "헤어지고 너무 힘들어", "ㅋ"]


def test_token_f1_counts_word_pieces_and_ignores_special_tokens():
    a, b, c, d = (NUM_SPECIAL + i for i in range(4))
    left = tf.constant([[[a, b, END_ID, PAD_ID], [c, d, END_ID, PAD_ID], [END_ID, PAD_ID, PAD_ID, PAD_ID]]])
    right = tf.constant([[[a, b, c, END_ID], [d, END_ID, PAD_ID, PAD_ID]]])
    scores = token_f1(left, right).numpy()[0]  # (3 candidates, 2 references)
    precision, recall = 2 / 2, 2 / 3
    assert np.allclose(scores[0], [2 * precision * recall / (precision + recall), 0.0])
    assert np.allclose(scores[1], [2 * 0.5 * (1 / 3) / (0.5 + 1 / 3), 2 * 0.5 * 1.0 / 1.5])
    assert np.allclose(scores[2], 0.0)  # an empty reply overlaps nothing


def test_the_reply_is_the_generated_one_or_a_retrieved_answer(tiny_bot):
    generated = tiny_bot.reply_batch(NEW_QUESTIONS + QUESTIONS[:5], candidates=0)
    reranked = tiny_bot.reply_batch(NEW_QUESTIONS + QUESTIONS[:5], candidates=8)
    nearest = tiny_bot.retriever.nearest(NEW_QUESTIONS + QUESTIONS[:5], 8).numpy()
    for reply, own, answers in zip(reranked, generated, nearest):
        assert reply == own or reply in {a.decode("utf-8") for a in answers}


def test_the_default_reply_is_what_the_decoding_loop_wrote(tiny_bot, monkeypatch):
    """No default reply is chosen among retrieved answers after decoding: the rerank stage never runs, and the
    reply is the model's own greedy decoding (the full-recompute oracle writes the same). The bot runs its stages
    op by op, so every reply runs them (a traced graph would run the Python of a stage only while tracing)."""
    def refuse(*_, **__):
        raise AssertionError("the default reply was chosen after decoding")

    monkeypatch.setattr(Loop, "rerank", refuse)
    bot = Chatbot(tiny_bot.model, tiny_bot.tokenizer, tiny_bot.config, retriever=tiny_bot.retriever,
                  compilation="eager")
    questions = NEW_QUESTIONS + QUESTIONS[:5]
    replies = bot.reply_batch(questions)
    checked = [0, 3, 5]  # new and training questions; the oracle recomputes everything, so only these
    assert [replies[i] for i in checked] == [bot.naive_reply(questions[i]) for i in checked]
    assert [bot.reply(q) for q in questions[:3]] == replies[:3]
    with pytest.raises(AssertionError, match="chosen after decoding"):  # what reranking would have done
        bot.reply_batch(questions, candidates=4)


def test_training_questions_still_get_their_own_answers(tiny_bot):
    answers = [a for _, a, _ in TINY_PAIRS]
    assert tiny_bot.reply_batch(QUESTIONS, candidates=8) == answers


def test_a_recurring_retrieved_answer_wins_over_a_lone_one(tiny_bot):
    """Consensus: among equally close questions, the answer that two of them share is chosen."""
    decoder = tiny_bot.generator.loop
    encoder_ids = tiny_bot.prepare(["처음 보는 질문이에요"], None, 0).encoder_ids
    ids = tiny_bot.tokenizer.encode(["오늘만 버텨봐요.", "공원 산책 좋아요."])
    rows = [row + [END_ID] + [PAD_ID] * (decoder.max_length - len(row) - 1) for row in ids]
    retrieved = tf.constant([[rows[1], rows[0], rows[0]]], tf.int32)
    generated = tf.constant([rows[1]], tf.int32)
    options = tiny_bot.options(tiny_bot.check())
    cross_cache = tiny_bot.generator.loop.encode(encoder_ids)
    chosen = decoder.rerank(Prepared(encoder_ids, retrieved, tf.constant([[0.5, 0.5, 0.5]]), tf.ones([1])), cross_cache,
                            generated, options)
    assert chosen.numpy()[0].tolist() == rows[0]


def test_a_retrieved_answer_longer_than_max_new_tokens_is_never_chosen(tiny_bot):
    for question in NEW_QUESTIONS + QUESTIONS[:8]:
        ids = tiny_bot.reply_ids([question], max_new_tokens=2, candidates=8)[0].tolist()
        assert len([t for t in ids if t >= NUM_SPECIAL]) <= 2, question


def test_candidates_need_a_retrieval_index(tiny_bot):
    bare = Chatbot(tiny_bot.model, tiny_bot.tokenizer, tiny_bot.config, retriever=tiny_bot.retriever)
    assert bare.plan(GenerationConfig(candidates=8)).candidates == min(8, len(tiny_bot.retriever))
    assert bare.plan(GenerationConfig(candidates=0)).candidates == 0
    bare.retriever = None
    assert bare.plan(GenerationConfig(candidates=8)).candidates == 0


def test_reranking_reads_each_reply_up_to_its_width(tiny_bot, monkeypatch):
    """The teacher-forced pass is cut to RERANK_WIDTH tokens: a reply that ends within them scores as over
    the model's whole length, a longer one as its first RERANK_WIDTH tokens."""
    import chatbot.decoding.rerank as rerank

    decoder = tiny_bot.generator.loop
    encoder_ids = tiny_bot.prepare(["배고파", "비 온다"], None, 0).encoder_ids
    cross_cache = tiny_bot.generator.loop.encode(encoder_ids)
    width, length = 6, tiny_bot.model.max_length
    short = [NUM_SPECIAL + 1, NUM_SPECIAL + 2, END_ID] + [PAD_ID] * (length - 3)
    long = [NUM_SPECIAL + 3 + i for i in range(length - 1)] + [END_ID]
    replies = tf.constant([short, long])
    model = tiny_bot.model
    whole = rerank.mean_log_likelihood(model, replies, encoder_ids, cross_cache).numpy()
    beginning = rerank.mean_log_likelihood(model, tf.constant([short, long[:width] + [PAD_ID] * (length - width)]),
                                           encoder_ids, cross_cache).numpy()
    monkeypatch.setattr(rerank, "RERANK_WIDTH", width)
    cut = rerank.mean_log_likelihood(model, replies, encoder_ids, cross_cache).numpy()
    assert np.allclose(cut[0], whole[0], atol=1e-5) and np.allclose(cut[1], beginning[1], atol=1e-5)
    assert not np.allclose(cut[1], whole[1], atol=1e-5)


def test_weights_without_likelihood_skip_its_pass_and_choose_as_with_it(tiny_bot, monkeypatch):
    """Likelihood weight 0: decoding never runs the teacher-forced pass, and picks what the weighted choice
    over the full features (likelihoods computed) picks."""
    import dataclasses

    import chatbot.decoding.rerank as rerank
    from chatbot.config import RerankConfig

    weights = RerankConfig(likelihood=0.0, similarity=1.0, consensus=2.0)
    questions = NEW_QUESTIONS + QUESTIONS[:5]
    options = tiny_bot.options(tiny_bot.check())
    found = reply_features(tiny_bot, tf.constant(questions), options, 8)
    assert np.any(found.likelihood.numpy() != 0)
    confident = tiny_bot.prepare(tf.constant(questions), None, 8).confident
    expected = [reply.decode() for reply in tiny_bot.finish(  # as users get them
        tf.constant(questions), rerank.choose(found, weights), confident)[1].numpy()]

    def no_pass(*args):
        raise AssertionError("the likelihood pass ran")

    monkeypatch.setattr(rerank, "mean_log_likelihood", no_pass)
    plain = Chatbot(tiny_bot.model, tiny_bot.tokenizer, dataclasses.replace(tiny_bot.config, rerank=weights),
                    retriever=tiny_bot.retriever, compilation="eager")  # one batch: nothing to trace
    assert plain.reply_batch(questions, candidates=8) == expected


def test_the_likelihood_pass_reads_only_the_shortlist_and_the_choice_stays(tiny_bot, monkeypatch):
    """Given the weights, the teacher-forced pass reads the generated reply and the SHORTLIST best retrieved
    answers only: their likelihoods are those of the pass over every candidate, the others stay 0, and the
    choice is the one made over every candidate's features."""
    import chatbot.decoding.rerank as rerank
    from chatbot.config import RerankConfig

    decoder, model = tiny_bot, tiny_bot.model
    weights = RerankConfig(likelihood=0.5, similarity=1.0, consensus=2.0)
    texts = tf.constant(NEW_QUESTIONS + QUESTIONS[:5])
    options = tiny_bot.options(tiny_bot.check())
    every = reply_features(decoder, texts, options, 8)
    assert every.candidates.shape[1] == 9 > 1 + rerank.SHORTLIST
    encoder_ids = tiny_bot.prepare(texts, None, 8).encoder_ids
    cross_cache = tiny_bot.generator.loop.encode(encoder_ids)
    rows_read, full_pass = [], rerank.mean_log_likelihood

    def counted(model, replies, *args):
        rows_read.append(replies.shape[0])
        return full_pass(model, replies, *args)

    monkeypatch.setattr(rerank, "mean_log_likelihood", counted)
    listed = rerank.features(model, encoder_ids, cross_cache, every.candidates[:, 0], every.candidates[:, 1:],
                             every.similarity[:, 1:], options.steps, weights)
    assert rows_read == [len(NEW_QUESTIONS + QUESTIONS[:5]) * (1 + rerank.SHORTLIST)]
    on_list = np.zeros(every.likelihood.shape, bool)
    np.put_along_axis(on_list, rerank.shortlist(every, weights).numpy(), True, axis=1)
    assert on_list[:, 0].all() and (on_list.sum(axis=1) == 1 + rerank.SHORTLIST).all()
    assert np.allclose(listed.likelihood.numpy()[on_list], every.likelihood.numpy()[on_list], atol=1e-4)
    assert (listed.likelihood.numpy()[~on_list] == 0).all() and (every.likelihood.numpy()[~on_list] != 0).all()
    assert (rerank.choice(listed, weights).numpy() == rerank.choice(every, weights).numpy()).all()


def test_an_answer_off_the_shortlist_is_never_chosen_whatever_its_likelihood(monkeypatch):
    import chatbot.decoding.rerank as rerank
    from chatbot.config import RerankConfig

    similarity = tf.constant([[0.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.1]])
    likelihood = tf.constant([[-10.0, -10.0, -10.0, -10.0, -10.0, -10.0, 0.0]])  # the last one: by far the likeliest
    found = rerank.Features(tf.zeros([1, 7, 4], tf.int32), likelihood, similarity, tf.zeros_like(similarity),
                            tf.ones([1, 7], tf.bool))
    weights = RerankConfig(likelihood=1.0, similarity=1.0, consensus=1.0)
    assert rerank.SHORTLIST < 6 and rerank.choice(found, weights).numpy().tolist() == [1]
    monkeypatch.setattr(rerank, "SHORTLIST", 6)
    assert rerank.choice(found, weights).numpy().tolist() == [6]


# -- each decoding setting changes a reply it must change, and only when it is on --------------------------------
# The tiny model answers with near certainty, so no setting can move its replies: these drive the product's
# decoding loop (`Chatbot.loop`: logit processing, samplers, beam ranking, rescoring) over a `ToyModel`
# whose every next-token logit the test writes down.

A, B, C, D, ASKED = range(NUM_SPECIAL, NUM_SPECIAL + 5)
QUESTION = [START_ID, ASKED, END_ID]  # the encoder input of a question, with no retrieved answer


def toy_replies(model, encoder_ids=(QUESTION,), **settings):
    """The reply ids (padding dropped) `model` decodes for `encoder_ids` with these decoding settings."""
    from chatbot.config import ChatbotConfig, ContextConfig, ModelConfig

    settings = GenerationConfig(**settings)
    config = ChatbotConfig(model=ModelConfig(vocab_size=model.vocab_size, max_length=model.max_length),
                           context=ContextConfig(retrieved=0))
    bot = Chatbot(model, None, config, compilation="graph")  # the loop alone: no tokenizer, no index
    plan = bot.plan(settings)
    rows = len(encoder_ids)
    width = max(map(len, encoder_ids))
    encoder_ids = tf.constant([list(row) + [PAD_ID] * (width - len(row)) for row in encoder_ids], tf.int32)
    prepared = Prepared(encoder_ids, tf.zeros([rows, 0, model.max_length], tf.int32), tf.zeros([rows, 0]), tf.ones([rows]))
    loop = tf.function(lambda prepared, options: bot.generator.loop(prepared, options, plan), autograph=False)  # as compiled
    ids = loop(prepared, Options.of(settings, model.max_length, 0))
    return [[token for token in row if token != PAD_ID] for row in ids.numpy().tolist()]


def toy():
    from toy_model import ToyModel

    return ToyModel(NUM_SPECIAL + 5)


def test_no_repeat_ngram_size_breaks_a_loop_only_when_set():
    """A B A B ... to the length limit, unless the bigram A B may not come twice: then A's second choice, C."""
    looping = toy().follows(START_ID, {A: 5}).follows(A, {B: 5, C: 3}).follows(B, {A: 5}).follows(C, {END_ID: 5})
    assert toy_replies(looping) == [[A, B] * 4]
    assert toy_replies(looping, no_repeat_ngram_size=2) == [[A, B, A, C, END_ID]]
    assert toy_replies(looping, strategy="beam", num_beams=2) == [[A, B] * 4]
    assert toy_replies(looping, strategy="beam", num_beams=2, no_repeat_ngram_size=2) == [[A, B, A, C, END_ID]]


def test_a_repetition_penalty_takes_a_fresh_token_over_a_repeated_one_only_when_above_one():
    """After B the model prefers A (logit 3) to C (2); A was written already, so a penalty of 2 halves its logit."""
    looping = toy().follows(START_ID, {A: 5}).follows(A, {B: 5}).follows(B, {A: 3, C: 2}).follows(C, {END_ID: 5})
    assert toy_replies(looping) == toy_replies(looping, repetition_penalty=1.0) == [[A, B] * 4]
    assert toy_replies(looping, repetition_penalty=1.4) == [[A, B] * 4]  # 3 / 1.4 is still above 2
    assert toy_replies(looping, repetition_penalty=2.0) == [[A, B, C, END_ID]]


def short_or_long():
    """A then END (probability 0.6), or B C D END (0.4): the short reply has the higher summed log-probability,
    the long one the higher per token."""
    return (toy().follows(START_ID, {A: np.log(0.6), B: np.log(0.4)}).follows(A, {END_ID: 9})
            .follows(B, {C: 9}).follows(C, {D: 9}).follows(D, {END_ID: 9}))


def test_the_length_penalty_decides_between_a_short_and_a_long_beam():
    model = short_or_long()
    assert toy_replies(model, strategy="beam", num_beams=2, length_penalty=0.0) == [[A, END_ID]]  # summed scores
    assert toy_replies(model, strategy="beam", num_beams=2, length_penalty=1.0) == [[B, C, D, END_ID]]
    assert toy_replies(model, strategy="beam", num_beams=1, length_penalty=1.0) == [[A, END_ID]]  # one beam: greedy
    assert toy_replies(model, length_penalty=2.0) == [[A, END_ID]]  # greedy ranks no beams


def test_agreement_picks_the_beam_that_shares_the_retrieved_answers_words():
    """Beams A and B C; A is likelier, but the encoder input holds the retrieved answer B C."""
    model = (toy().follows(START_ID, {A: np.log(0.6), B: np.log(0.4)}).follows(A, {END_ID: 9})
             .follows(B, {C: 9}).follows(C, {END_ID: 9}))
    retrieved = [*QUESTION, SEPARATOR_ID, B, C]
    beam = dict(strategy="beam", num_beams=2)
    assert toy_replies(model, [retrieved], **beam) == [[A, END_ID]]  # agreement 0: plain beam search
    assert toy_replies(model, [retrieved], **beam, agreement=1.0) == [[B, C, END_ID]]
    assert toy_replies(model, [QUESTION], **beam, agreement=1.0) == [[A, END_ID]]  # nothing retrieved to agree with
    assert toy_replies(model, [retrieved], agreement=1.0) == [[A, END_ID]]  # greedy ranks no beams


def test_mbr_picks_the_beam_the_others_agree_with():
    """Beams A (probability 0.5), B D and C D (0.25 each): A is likeliest, but the other two share D."""
    model = (toy().follows(START_ID, {A: np.log(0.5), B: np.log(0.25), C: np.log(0.25)}).follows(A, {END_ID: 9})
             .follows(B, {D: 9}).follows(C, {D: 9}).follows(D, {END_ID: 9}))
    beam = dict(strategy="beam", num_beams=3)
    assert toy_replies(model, **beam) == toy_replies(model, **beam, mbr=0.0) == [[A, END_ID]]
    (reply,) = toy_replies(model, **beam, mbr=1.0)
    assert reply in ([B, D, END_ID], [C, D, END_ID])
    assert toy_replies(model, strategy="beam", num_beams=1, mbr=1.0) == [[A, END_ID]]  # no other beams to agree with
