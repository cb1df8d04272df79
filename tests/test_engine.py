import os

import numpy as np
import pytest

from chatbot.config import GenerationConfig
from chatbot.decoding.generate import BATCH_BUCKETS, COMPILED_KEPT
from chatbot.decoding.chatbot import Chatbot
from chatbot.model.inputs import bucket
from chatbot.tokenizer.subword import END_ID, NUM_SPECIAL
from conftest import TINY_PAIRS, follow_up_answer, history_of, stages_run

QUESTIONS = [q for q, _, _ in TINY_PAIRS]


def test_cached_greedy_equals_naive_full_recompute(tiny_bot):
    for question in QUESTIONS[:3] + ["처음 보는 질문이에요", "ㅋㅋㅋㅋ"]:
        assert tiny_bot.reply(question, candidates=0) == tiny_bot.naive_reply(question), question


@pytest.mark.slow  # XLA compilations of several shapes
def test_xla_decoding_gives_the_same_tokens_as_the_uncompiled_loop(tiny_bot):
    """The compiled loop (padded batch and encoder-length buckets) against the same loop run as a
    plain graph, token for token, for greedy and beam, for one question and for a batch."""
    plain = tiny_bot
    xla = Chatbot(tiny_bot.model, tiny_bot.tokenizer, tiny_bot.config, retriever=tiny_bot.retriever)
    questions = QUESTIONS[:10] + ["처음 보는 질문이에요", "ㅋ", "아주 " * 40 + "긴 질문"]
    for options in ({}, {"strategy": "beam"}):  # XLA draws other random numbers: not sampling
        assert np.array_equal(xla.reply_ids(questions, **options), plain.reply_ids(questions, **options))
    for question in questions[:3]:  # one question alone: another batch bucket and encoder length compiled
        assert np.array_equal(xla.reply_ids([question]), plain.reply_ids([question]))
    assert xla.compilation == "xla" and plain.compilation == "graph"


def test_batches_are_padded_to_a_few_shapes(tiny_bot):
    assert [int(bucket(n, (1, 4, 16))) for n in (0, 1, 2, 4, 5, 16, 17, 600)] == [1, 1, 4, 4, 16, 16, 17, 600]
    assert [int(bucket(n, BATCH_BUCKETS)) for n in (3, 32, 33, 600)] == [4, 32, 64, 600]
    assert list(BATCH_BUCKETS) == sorted(BATCH_BUCKETS) and BATCH_BUCKETS[0] == 1
    lengths = tiny_bot.length_buckets
    assert lengths[-1] == tiny_bot.model.encoder_length and list(lengths) == sorted(set(lengths))
    width = tiny_bot.prepare(["안녕", "아주 " * 40 + "긴 질문"], None, 0).encoder_ids.shape[1]
    assert width in lengths


def test_beam_width_one_equals_greedy(tiny_bot):
    """The model's own replies (candidates=0): with reranking a retrieved answer could hide a difference."""
    for question in QUESTIONS[:8] + ["처음 보는 질문이에요"]:
        assert (tiny_bot.reply(question, strategy="beam", num_beams=1, candidates=0)
                == tiny_bot.reply(question, candidates=0))


def test_top_k_one_sampling_equals_greedy(tiny_bot):
    for question in QUESTIONS[:8] + ["처음 보는 질문이에요"]:
        assert (tiny_bot.reply(question, strategy="sample", top_k=1, temperature=2.0, candidates=0)
                == tiny_bot.reply(question, candidates=0))


def test_same_seed_same_sample_and_seeds_differ(tiny_bot):
    options = dict(strategy="sample", temperature=3.0, seed=7)
    assert tiny_bot.reply("배고파", **options) == tiny_bot.reply("배고파", **options)
    # the sampled reply itself (by default it is weighed against retrieved answers, which may win every time)
    samples = {tiny_bot.reply("배고파", strategy="sample", temperature=3.0, seed=seed, candidates=0) for seed in range(8)}
    assert len(samples) > 1


def test_reply_batch_equals_single_replies(tiny_bot):
    questions = QUESTIONS[:6] + ["처음 보는 질문이에요"]
    for options in ({}, {"strategy": "beam"}):  # a sampled row's draw depends on its batch
        assert tiny_bot.reply_batch(questions, **options) == [tiny_bot.reply(q, **options) for q in questions]


def test_stream_grows_to_the_reply(tiny_bot):
    for options in ({}, {"strategy": "beam"}, {"strategy": "sample", "seed": 5}):
        chunks = list(tiny_bot.stream("고백할까?", **options))
        assert chunks[-1] == tiny_bot.reply("고백할까?", **options)
        assert all(b.startswith(a.rstrip()) for a, b in zip(chunks, chunks[1:]))
    assert len(list(tiny_bot.stream("고양이 키우고 싶어"))) > 1


def test_replies_never_contain_special_tokens_or_exceed_max_length(tiny_bot):
    max_length = tiny_bot.model.max_length
    for options in ({}, {"strategy": "beam"}, {"strategy": "sample", "temperature": 5.0, "seed": 1}):
        ids = tiny_bot.reply_ids(QUESTIONS[:10], **options)
        assert ids.shape[1] <= max_length
        for row in ids.tolist():
            body = row[:row.index(END_ID)] if END_ID in row else row
            assert all(token >= NUM_SPECIAL for token in body if token != 0)
        for reply in tiny_bot.reply_batch(QUESTIONS[:10], **options):
            assert "<" not in reply and "⁇" not in reply


def test_max_new_tokens_limits_length_in_every_strategy(tiny_bot):
    for options in ({}, {"strategy": "beam"}, {"strategy": "sample", "seed": 3}):
        short = tiny_bot.reply_ids(["고양이 키우고 싶어"], max_new_tokens=2, **options)[0]
        assert np.count_nonzero(short) <= 2
        assert len(list(tiny_bot.stream("고양이 키우고 싶어", max_new_tokens=2, **options))) <= 2
    assert len(tiny_bot.tokenizer.encode([tiny_bot.naive_reply("고양이 키우고 싶어", max_new_tokens=2)])[0]) <= 2


def test_sampling_seeds_do_not_follow_pythons_global_random(tiny_bot):
    """Training reseeds Python's `random` (Keras draws layer seeds from it); a loaded bot draws its
    own, so replies sampled without a seed do not repeat after every training."""
    import random

    random.seed(0)
    first = int(tiny_bot.options(tiny_bot.check(strategy="sample")).seed)
    random.seed(0)
    assert int(tiny_bot.options(tiny_bot.check(strategy="sample")).seed) != first


def test_a_hot_sample_of_the_real_model_repeats_no_bigram_when_told_not_to(tiny_bot):
    """The real model's invariant; that the setting changes a reply that loops is shown on a model made to loop
    (test_rerank.py)."""
    ids = tiny_bot.reply_ids(["처음 보는 질문이에요"], strategy="sample", temperature=5.0, seed=0,
                             no_repeat_ngram_size=2, max_new_tokens=16, candidates=0)[0].tolist()
    grams = [tuple(ids[i:i + 2]) for i in range(len(ids) - 1) if 0 not in ids[i:i + 2]]
    assert len(grams) == len(set(grams))


def test_attention_shapes_and_rows_sum_to_one(tiny_bot):
    result = tiny_bot.attention("배고파")
    weights = result["weights"]
    assert result["reply"] == tiny_bot.reply("배고파")
    model = tiny_bot.config.model
    assert weights.shape == (model.num_layers, model.num_heads, len(result["reply_tokens"]),
                             len(result["question_tokens"]))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert "<pad>" not in result["question_tokens"]  # the plot shows what the model read, not the XLA padding


def test_attention_of_a_reply_as_long_as_the_model_allows_still_fits_its_positions(tiny_bot):
    longest = tiny_bot.config.model.max_length
    result = tiny_bot.attention("배고파", reply="맛있는 거 드세요 " * longest)  # far more tokens than positions
    assert result["weights"].shape[2] == len(result["reply_tokens"]) == longest  # start + reply, then the end


def test_bad_decoding_options_are_rejected(tiny_bot):
    with pytest.raises(ValueError):
        tiny_bot.reply("안녕", strategy="nucleus")
    with pytest.raises(ValueError):
        tiny_bot.reply("안녕", top_p=0.0)


# -- bounds are checked before any compiled call; a refused request leaves nothing behind --

@pytest.mark.parametrize("bad", [dict(seed=2**31), dict(max_new_tokens=2**31), dict(top_k=2**31), dict(num_beams=9),
                                 dict(num_beams=10**400), dict(seed=10**400), dict(temperature=float("nan")), dict(top_p=float("inf")),
                                 dict(repetition_penalty=float("nan")), dict(length_penalty=float("-inf")),
                                 dict(no_repeat_ngram_size=1), dict(no_repeat_ngram_size=17)])
def test_bad_options_are_refused_before_decoding_and_the_next_reply_works(tiny_bot, bad):
    compiled = set(tiny_bot.compiled_plans)
    for call in (lambda: tiny_bot.reply("배고파", **bad), lambda: tiny_bot.reply_batch(["배고파", "잘 자"], **bad),
                 lambda: tiny_bot.reply_batch([], **bad), lambda: list(tiny_bot.stream("배고파", **bad))):
        with pytest.raises(ValueError):
            call()
    assert set(tiny_bot.compiled_plans) == compiled  # no function compiled (and kept) for a refused width
    assert tiny_bot.reply("배고파") == "맛있는 거 드세요."


def test_no_repeat_ngram_size_up_to_max_length_is_allowed(tiny_bot):
    assert tiny_bot.max_length == 16
    assert isinstance(tiny_bot.reply("배고파", no_repeat_ngram_size=16), str)


def test_questions_over_the_cap_are_refused_with_a_clear_message(tiny_bot):
    from chatbot.config import MAX_QUESTION_CHARS

    long = "가" * (MAX_QUESTION_CHARS + 1)
    for call in (lambda: tiny_bot.reply(long), lambda: tiny_bot.reply_batch(["배고파", long]),
                 lambda: list(tiny_bot.stream(long)), lambda: tiny_bot.attention(long)):
        with pytest.raises(ValueError, match="too long"):
            call()
    assert isinstance(tiny_bot.reply("가" * MAX_QUESTION_CHARS), str)


def test_agreement_is_the_token_f1_with_the_retrieved_answers():
    import tensorflow as tf

    from chatbot.decoding.rerank import agreement
    from chatbot.tokenizer.subword import SEPARATOR_ID

    encoder = tf.constant([[1, 20, 21, 2, SEPARATOR_ID, 30, 31, 32, 33, 0],   # retrieved answer 30 31 32 33
                           [1, 20, 30, 2, 0, 0, 0, 0, 0, 0],                   # no retrieved answer
                           [1, 20, 2, SEPARATOR_ID, 1, 40, 41, 2, 30, 31]])    # neighbour asked 40 41, answered 30 31
    replies = tf.constant([[[30, 31, 2, 0], [40, 41, 2, 0], [30, 31, 32, 33]],
                           [[30, 31, 2, 0], [20, 2, 0, 0], [30, 0, 0, 0]],
                           [[30, 31, 2, 0], [40, 41, 2, 0], [20, 2, 0, 0]]])
    scores = agreement(replies, encoder).numpy()
    assert np.allclose(scores[0], [2 * 1.0 * 0.5 / 1.5, 0.0, 1.0])  # question tokens (20, 21) never count
    assert np.allclose(scores[1], 0.0)
    assert np.allclose(scores[2], [1.0, 0.0, 0.0])  # nor the neighbour's question


def test_beam_consensus_is_the_mean_token_f1_with_the_other_beams():
    import tensorflow as tf

    from chatbot.decoding.rerank import beam_consensus

    replies = tf.constant([[[30, 31, 2, 0], [30, 31, 32, 2], [40, 41, 2, 0]],
                           [[30, 2, 0, 0], [2, 0, 0, 0], [30, 2, 0, 0]]])
    scores = beam_consensus(replies).numpy()
    assert np.allclose(scores[0], [0.8 / 2, 0.8 / 2, 0.0])  # F1 of (30 31) and (30 31 32): 2 * 1 * 2/3 / (5/3)
    assert np.allclose(scores[1], [0.5, 0.0, 0.5])  # an empty beam shares nothing, itself included


def test_mbr_leaves_greedy_alone_and_is_refused_out_of_bounds(tiny_bot):
    questions = ["처음 보는 질문이에요", "오늘 회사에서 혼났어", *QUESTIONS[:4]]
    assert tiny_bot.reply_batch(questions, mbr=5.0) == tiny_bot.reply_batch(questions)  # greedy: no beams
    for bad in (-1.0, 101.0, float("nan")):
        with pytest.raises(ValueError, match="mbr"):
            tiny_bot.reply("안녕", strategy="beam", mbr=bad)


def test_agreement_leaves_greedy_alone(tiny_bot):
    """That it moves beam search is shown on a model whose beams it must reorder (test_rerank.py)."""
    assert tiny_bot.reply_batch(QUESTIONS[:12], agreement=50.0) == tiny_bot.reply_batch(QUESTIONS[:12])


@pytest.mark.slow  # a bot of its own, three plans traced and 84 replies
def test_a_client_sweeping_every_tensor_setting_builds_no_new_graph(tiny_model_dir):
    """Settings that need no new shape are tensors of the plan's one function: twelve values of each (n-gram size,
    repetition penalty; temperature, top-k, top-p under sampling; length penalty, agreement under beams) keep the
    three plans' graphs and trace nothing more, so such a sweep costs no memory."""
    bot = Chatbot.load(tiny_model_dir, compilation="graph")
    sweeps = {(): {"no_repeat_ngram_size": [0, *range(2, 13)], "repetition_penalty": [1 + i / 4 for i in range(12)]},
              (("strategy", "sample"),): {"temperature": [0.2 + i / 4 for i in range(12)], "top_k": list(range(12)),
                                          "top_p": [0.3 + i / 20 for i in range(12)]},
              (("strategy", "beam"), ("num_beams", 2)): {"length_penalty": [i / 4 for i in range(12)],
                                                          "agreement": [float(i) for i in range(12)]}}
    for plan, settings in sweeps.items():
        bot.reply("배고파", seed=1, **dict(plan))
    def traced():
        return sorted(((plan, bot.generator._compiled.peek(plan).experimental_get_tracing_count()) for plan in bot.compiled_plans),
                      key=repr)

    before = traced()
    assert len(before) == 3 and all(count == 1 for _, count in before)
    for plan, settings in sweeps.items():
        for name, values in settings.items():
            for value in values:
                assert isinstance(bot.reply("배고파", seed=1, **dict(plan), **{name: value}), str)
    assert traced() == before


SWEEP_KEPT = 3  # the sweep's process keeps fewer plans than COMPILED_KEPT, so fewer tracings fill its cache
SWEEP = f"""
import gc, json, sys
from chatbot.startup import import_tensorflow_quietly
import_tensorflow_quietly(lean=True)  # as the command line loads it: without Keras's optional extras
import chatbot.decoding.generate
from chatbot.decoding.chatbot import Chatbot
chatbot.decoding.generate.COMPILED_KEPT = {SWEEP_KEPT}

def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

bot = Chatbot.load(sys.argv[1], compilation="graph")
sweep = [dict(strategy="beam", num_beams=n) for n in range(2, 8)]  # alike functions, so each costs about the same
bot.reply("배고파")
rss = [resident_mib()]
for options in sweep:
    bot.reply("배고파", **options)
    gc.collect()  # what is still kept, not what the collector has yet to free: evicted graphs sit in cycles
    rss.append(resident_mib())
print(json.dumps({{"rss": rss, "kept": [len(bot.compiled_plans)]}}))
"""


@pytest.mark.slow  # a TensorFlow subprocess tracing 7 decoding functions
def test_sweeping_valid_static_options_keeps_memory_bounded(tiny_model_dir):
    """Each beam count (as each candidate count) is a function of its own, traced and kept: every one is a valid
    option, so without a bound any caller could grow the process by tens of MB a request. Measured in a
    process of its own, so that nothing else the test worker did moves its memory."""
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", SWEEP, str(tiny_model_dir)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    rss = measured["rss"]
    assert max(measured["kept"]) <= SWEEP_KEPT < COMPILED_KEPT
    full = SWEEP_KEPT - 1  # rss[0] has the default plan's functions: this many more fill the cache
    per_function = (rss[full] - rss[0]) / full
    assert rss[-1] - rss[full] < 0.6 * per_function * (len(rss) - 1 - full)  # about 1.0 when every one is kept


def test_details_say_when_a_reply_is_a_training_answer_and_which_question_it_answered(tiny_bot):
    copied = tiny_bot.reply("배고파", details=True)
    assert copied == {"reply": "맛있는 거 드세요.", "copied": True, "source_question": "배고파",
                      "nearest_question": "배고파", "fallback": False}
    written = tiny_bot.reply("배고파", details=True, max_new_tokens=1, candidates=0)  # cut short: no training answer
    assert written["copied"] is False and written["source_question"] is None
    assert written["nearest_question"] == "배고파"


@pytest.mark.slow  # XLA compilations of three encoder lengths
def test_a_warmed_server_uses_xla_only_for_settings_it_compiled_through_the_graph_requests_run(tiny_model_dir,
                                                                                              tiny_bot):
    """Before its warm-up, and for settings it did not warm up, a warmed server replies with a plain graph, so no
    request waits for XLA. The warm-up's replies and a request's run one traced graph around one traced loop:
    XLA's compilations of a shape are shared only then (a loop called on its own compiles apart)."""
    bot = Chatbot.load(tiny_model_dir, "warmed")
    assert bot.reply("배고파") == tiny_bot.reply("배고파")
    assert [plan.jit for plan in bot.compiled_plans] == [False]  # before the warm-up: a plain graph
    ran = stages_run(bot)
    bot.warm_up(rows=(1,))  # every encoder length of the one-question batch compiled here
    (compiled,) = [plan for plan in bot.compiled_plans if plan.jit]
    assert ran.count("loop") == 1 and bot.ready(compiled)  # one traced loop for every length
    ran.clear()
    assert bot.reply("배고파") == tiny_bot.reply("배고파")
    assert ran == []  # the request ran the graph the warm-up traced
    assert bot.reply("배고파", no_repeat_ngram_size=3) == tiny_bot.reply("배고파", no_repeat_ngram_size=3)
    assert [plan for plan in bot.compiled_plans if plan.jit] == [bot.plan(GenerationConfig())] == [compiled]


def test_an_eager_bot_replies_as_the_graph_does_without_tracing_anything(tiny_bot):
    """`chat -q` answers once per process: run op by op, the same loop gives the same tokens, and no
    function was traced for it (tracing the loop costs more than running it once)."""
    eager = Chatbot(tiny_bot.model, tiny_bot.tokenizer, tiny_bot.config, retriever=tiny_bot.retriever,
                    compilation="eager")
    questions = QUESTIONS[:2] + ["처음 보는 질문이에요"]
    for options in ({}, {"strategy": "beam"}):  # the beam search other tests here trace
        assert np.array_equal(eager.reply_ids(questions, **options), tiny_bot.reply_ids(questions, **options))
    assert eager.reply("배고파") == tiny_bot.reply("배고파")
    sampled = dict(strategy="sample", temperature=3.0, seed=7)  # a seed draws the same tokens op by op
    assert eager.reply("배고파", **sampled) == tiny_bot.reply("배고파", **sampled)
    assert not eager.compiled_plans  # nothing built or traced


@pytest.mark.parametrize("blank", ["", " ", "\u3000\t", "\u200b"])
def test_a_blank_question_is_refused_not_answered_as_if_someone_asked(tiny_bot, blank):
    with pytest.raises(ValueError, match="the question is empty"):
        tiny_bot.reply(blank)
    with pytest.raises(ValueError, match="the question is empty"):
        tiny_bot.reply_batch(["배고파", blank])


def test_a_tone_changes_the_reply_of_a_model_that_learned_tones_and_nothing_otherwise(tiny_bot):
    """The tiny model answers a training question alike in every tone. A `ToyModel` answers with its sad reply
    when the encoder input holds the sad tone token: the tone must get from the caller to the model's input."""
    from toy_model import PLAIN_REPLY as plain, SAD_REPLY as sad, toned_chatbot

    toned = toned_chatbot(tiny_bot.tokenizer)
    assert toned.reply("헤어졌어") == plain
    assert toned.reply("헤어졌어", tone="sad") == toned.reply("헤어졌어", tone=1) == sad
    assert toned.reply_batch(["헤어졌어", "우울해"], tone="sad") == [sad, sad]
    assert list(toned.stream("헤어졌어", tone="sad"))[-1] == sad
    assert toned.reply("헤어졌어", tone="sad", strategy="beam", num_beams=2) == sad
    untoned = toned_chatbot(tiny_bot.tokenizer, learned_tones=False)
    assert untoned.reply("헤어졌어", tone="sad") == plain  # a model without tones ignores it


def test_a_looping_reply_is_said_once_alike_by_reply_batch_stream_beams_and_candidates(tiny_bot):
    """A `ToyModel` that says its phrase over and over to the length limit: every entry point says it once (the
    reply graph's `repeat_cut`; the stream runs the same cut on each prefix), greedy, with beams and with
    retrieved candidates alike."""
    from toy_model import PLAIN_REPLY as phrase, toned_chatbot

    bot = toned_chatbot(tiny_bot.tokenizer)
    ids = bot.tokenizer.encode([phrase])[0]
    bot.model.follows(ids[-1], {ids[0]: 10.0})  # after the phrase, the phrase again instead of the end token
    assert bot.reply("안녕") == phrase
    for decoding in ({}, {"strategy": "beam", "num_beams": 2}):
        assert bot.reply_batch(["안녕", "반가워"], **decoding) == [phrase, phrase]
        streamed = list(bot.stream("안녕", **decoding))
        assert streamed[-1] == phrase and all(phrase.startswith(part) or part.startswith(phrase)
                                              for part in streamed)
    ranked = Chatbot(bot.model, bot.tokenizer, bot.config, retriever=tiny_bot.retriever, compilation="graph")
    for question in ("안녕하세요", "배고파"):  # the looping reply weighed against the training answers
        reply = ranked.reply(question, candidates=4)
        assert list(ranked.stream(question, candidates=4))[-1] == reply and reply.count(phrase) <= 1
    stutter = toned_chatbot(tiny_bot.tokenizer)
    word = ids[0]
    stutter.model.follows(word, {word: 10.0})  # one token said over and over: said once
    once = stutter.tokenizer.decode([[word]])[0]
    for decoding in ({}, {"strategy": "beam", "num_beams": 2}):
        assert stutter.reply("안녕", **decoding) == once == list(stutter.stream("안녕", **decoding))[-1]


def test_a_message_no_training_question_is_near_gets_the_fallback_everywhere(tiny_bot):
    """Below the calibrated threshold the reply is the fallback, from `reply`, a batch and a stream alike, and
    the details say so; a message that may signal a crisis still gets the crisis reply."""
    import dataclasses

    from chatbot.retrieval.retriever import Retriever
    from chatbot.safety.keywords import SELF_HARM_REPLY

    retriever = tiny_bot.retriever
    config = dataclasses.replace(tiny_bot.config, retrieval=dataclasses.replace(
        tiny_bot.config.retrieval, threshold=0.999, fallback="잘 모르겠어요. 가게로 전화 주세요."))
    strict = Chatbot(tiny_bot.model, tiny_bot.tokenizer, config, compilation="graph",
                     retriever=Retriever(list(retriever.pairs), config.retrieval, retriever.encoder, tiny_bot.tokenizer))
    assert config.retrieval.meaning and retriever.encoder is not None  # the tiny model reads meaning too
    asked = ["배고파", "양자역학 설명해줘", "죽고 싶어"]
    replies = strict.reply_batch(asked)
    assert replies == ["맛있는 거 드세요.", "잘 모르겠어요. 가게로 전화 주세요.", SELF_HARM_REPLY]
    assert [strict.reply(text) for text in asked] == replies
    assert [list(strict.stream(text))[-1] for text in asked] == replies
    assert strict.reply("양자역학 설명해줘", details=True)["fallback"] is True
    assert strict.reply("배고파", details=True)["fallback"] is False
    assert tiny_bot.reply("양자역학 설명해줘") != "잘 모르겠어요. 가게로 전화 주세요."


# -- the conversation before a message --

def test_the_same_follow_up_gets_the_reply_its_conversation_asks_for(tiny_bot):
    assert tiny_bot.reads_context  # trained with dialogues
    for dialogue in ("d1", "d2", "d3"):
        history = history_of(dialogue)
        assert tiny_bot.reply("응", history=history) == follow_up_answer(dialogue)
        assert list(tiny_bot.stream("응", history=history))[-1] == follow_up_answer(dialogue)
    histories = [history_of(d) for d in ("d3", "d1")]
    assert tiny_bot.reply_batch(["응", "응"], histories=histories) == [follow_up_answer("d3"), follow_up_answer("d1")]
    assert tiny_bot.reply_batch(["응"], histories=[[]]) == [tiny_bot.reply("응")]  # an empty history: no context


def test_a_first_message_with_an_empty_history_is_answered_as_before(tiny_bot):
    for question, answer, _ in TINY_PAIRS[:5]:
        assert tiny_bot.reply(question, history=[]) == tiny_bot.reply(question) == answer


def test_only_the_last_messages_are_read(tiny_bot):
    older = [{"role": "user", "content": "할 게 없네"}, {"role": "assistant", "content": "영화 볼래요?"}]
    assert tiny_bot.reply("응", history=[*older, *history_of("d2")]) == follow_up_answer("d2")


def test_provenance_names_the_conversation_it_matched(tiny_bot):
    details = tiny_bot.reply("응", history=history_of("d1"), details=True)
    assert details["copied"] and details["source_question"] == "소나기 온다 → 우산 있어요? → 응"


@pytest.mark.parametrize("history", [[{"role": "bot", "content": "안녕"}], "안녕", [{"role": "user", "content": 1}]])
def test_a_bad_history_is_refused_before_decoding(tiny_bot, history):
    with pytest.raises(ValueError, match="history"):
        tiny_bot.reply("응", history=history)
    with pytest.raises(ValueError, match="history"):
        list(tiny_bot.stream("응", history=history))
    with pytest.raises(ValueError, match="one history per question"):
        tiny_bot.reply_batch(["응", "응"], histories=[[]])


def test_the_crisis_reply_answers_the_new_message_not_the_conversation(tiny_bot):
    from chatbot.safety.keywords import crisis_reply

    crisis = "죽고 싶어"
    assert crisis_reply(crisis)
    said = [{"role": "user", "content": crisis}, {"role": "assistant", "content": crisis_reply(crisis)}]
    assert tiny_bot.reply("고마워", history=said) != crisis_reply(crisis)
    assert tiny_bot.reply(crisis, history=history_of("d1")) == crisis_reply(crisis)
    assert list(tiny_bot.stream(crisis, history=history_of("d1"))) == [crisis_reply(crisis)]


def test_a_request_is_validated_once(tiny_bot, monkeypatch, tmp_path):
    """One `/chat` request through the app, and one `Chatbot.reply`, check the question and the settings once."""
    import app
    import chatbot.decoding.chatbot as engine

    counts = {"questions": 0, "request": 0}
    check_questions, request = engine.check_questions, engine.Chatbot.request

    def counted_questions(texts):
        counts["questions"] += 1
        return check_questions(texts)

    def counted_request(self, *args, **kwargs):
        counts["request"] += 1
        return request(self, *args, **kwargs)

    monkeypatch.setattr(engine, "check_questions", counted_questions)
    monkeypatch.setattr(engine.Chatbot, "request", counted_request)
    tiny_bot.reply("배고파")
    assert counts == {"questions": 1, "request": 1}
    ui = app.ChatApp(tiny_bot, tmp_path, upload_folders=[tmp_path])
    ui.chat("배고파")
    assert counts == {"questions": 2, "request": 2}


@pytest.mark.slow  # loads a bot of its own and traces the defaults' reply graph
def test_the_apps_compilation_decodes_a_visitors_new_settings_op_by_op_and_traces_nothing(tiny_model_dir):
    """Under `Compilation.WARMED` (the app), settings that are neither warmed nor the defaults decode op by op: a
    sweep of n-gram sizes and candidate counts builds no graph (each traced plan held about 115 MB of the server
    on the default model), for the reply and the stream alike; the defaults' plain graph is still traced. (That
    op by op and traced decoding write the same reply is `test_an_eager_bot_replies_as_the_graph_does_without_tracing_anything`'s.)"""
    bot = Chatbot.load(tiny_model_dir, compilation="warmed")
    ran = stages_run(bot)
    sweep = [dict(strategy="beam", num_beams=2, no_repeat_ngram_size=2), dict(candidates=1, no_repeat_ngram_size=3)]
    for settings in sweep:
        before = len(ran)
        reply = bot.reply("배고파", **settings)
        assert reply in {answer for _, answer, _ in TINY_PAIRS} and list(bot.stream("배고파", **settings))[-1] == reply
        assert len(ran) > before  # its stages ran as Python: op by op, not a trace
    again = len(ran)
    bot.reply("배고파", **sweep[0])
    assert len(ran) > again and bot.compiled_plans == []  # asked again: still op by op, still no graph kept
    bot.reply("배고파")
    assert bot.compiled_plans == [bot.plan(bot.check())]  # the defaults' graph, as before warm-up
