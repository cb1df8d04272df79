"""Crisis safety: a message that may signal self-harm, suicide or abuse always gets one caring reply with
a number to call, whatever the model learned.

Owns: the curated Korean expressions (`SELF_HARM`, `ABUSE`), how a message is matched against them (its
normalised text with spaces, punctuation and ㅋ/ㅎ/ㅠ taken out, so "죽고 싶어ㅠㅠ", "죽고싶다..." and
"죽고 십어" read alike), and the replies (`SELF_HARM_REPLY` with 자살예방상담전화 109 and 119, `ABUSE_REPLY`
with 112 and 109). The match is one graph function, `crisis_replies`: the reply graph of every plan runs it after
decoding (`chatbot.decoding.postprocess`), so the CLI, the app, `/chat`, the Python API, the stream and the
SavedModel under TensorFlow Serving answer such a message alike and no training row can override it;
`crisis_reply` is the same function run eagerly on one message.

A model with multilingual-e5-small loaded also reads a message by meaning (`chatbot.safety.meaning`), after these lists
and only where they match nothing; without e5 the lists are the whole check.

The lists favour a false alarm over a miss, but keep everyday hyperbole out: "배고파 죽겠어", "힘들어 죽을
것 같아" and "이 일 빨리 끝내고 싶어" are not matched (tests/test_safety.py holds both kinds).
"""

from __future__ import annotations

import tensorflow as tf

from chatbot.data.text_tf import normalize_tf

# Matched on the compacted message (`crisis_replies`): Hangul syllables, letters and digits only. Literal stems and character classes,
# as RE2 (tf.strings.regex_full_match) reads them.
SELF_HARM = (
    "죽고싶", "죽고십", "죽고파", "죽어버리고싶", "죽어버릴까", "죽어야겠", "죽는게나을", "죽는게낫", "죽는게편할",
    "(나|내가|그냥|차라리)죽었으면", "죽을방법", "죽는방법", "편하게죽", "자살([^골]|$)", "자해", "극단적선택", "극단적인선택",
    "목숨을끊", "목숨끊", "생을마감", "삶을끝내", "인생을끝내", "다끝내고싶", "모든걸끝내", "그만살고싶",
    "살기싫", "살고싶지않", "살고싶은마음이없", "사는게의미없", "사는의미가없", "살이유가없", "살아갈이유가없",
    "왜살아야하는지", "살아야할이유", "사라지고싶", "사라져버리고싶", "없어지고싶", "없어져버리고싶",
    "세상에서사라지", "태어나지말았어야", "안태어났으면", "태어나지않았으면", "뛰어내리고싶", "뛰어내릴까",
    "뛰어내리려", "손목을긋", "손목긋", "손목을그", "칼로그었", "약을모으", "약을모아", "수면제를모", "수면제모",
    "목을매", "유서를", "유서써", "유서쓰", "나쁜생각이자꾸", "나쁜생각이들어", "나쁜마음을먹", "나쁜맘먹",
    "나하나없어져도", "내가없어져도", "내가없어지면", "나없어도아무도", "영원히잠들고싶", "눈뜨고싶지않",
    "내일이안왔으면", "내일이오지않았으면", "아침이안왔으면", "더는못버티겠", "더이상못버티겠", "더는버틸수없",
    "더이상버틸수없", "버틸힘이없",
)
ABUSE = (
    "(아빠|아버지|엄마|어머니|부모님|새아빠|새엄마|계부|계모|남편|아내|와이프|남친|남자친구|여친|여자친구|애인|오빠|형|"
    "언니|누나|삼촌|선배|사장님|사장)(가|이|께서|한테|에게)?(자꾸|또|매일|맨날|계속|술만먹으면|술마시면)?"
    "(때려|때렸|때리|폭행|손찌검|발로차|목을졸)",
    "(아빠|아버지|엄마|어머니|부모님|새아빠|새엄마|계부|계모|남편|아내|와이프|남친|남자친구|여친|여자친구|애인|오빠|형|"
    "언니|누나|삼촌|선배|사장님|사장)(한테|에게)(자꾸|또|매일|맨날|계속)?(맞았|맞아|맞고|얻어맞)",
    "가정폭력", "데이트폭력", "학대당", "학대를당", "학대받", "성폭행", "성추행당", "성추행을당", "강간",
    "스토킹당", "감금당", "집에가두",
)

SELF_HARM_REPLY = ("많이 힘드셨겠어요. 말해 줘서 고마워요. 혼자 견디지 말고 지금 자살예방상담전화 109에 전화해 "
                   "주세요. 24시간 언제든 이야기를 들어줘요. 당장 위험하다면 119에 연락해 주세요.")
ABUSE_REPLY = ("그런 일을 겪고 있다니 정말 걱정돼요. 잘못은 때리거나 해친 사람에게 있어요. 지금 위험하다면 112에 "
               "신고해 주세요. 마음이 너무 힘들 땐 109에서도 24시간 이야기를 들어줘요.")

NOT_COMPACT = "[^가-힣a-zA-Z0-9]+"  # what the match removes: spaces, punctuation, jamo (ㅋ/ㅎ/ㅠ), emoji
SELF_HARM_PATTERN = "|".join(SELF_HARM)
ABUSE_PATTERN = "|".join(ABUSE)


def crisis_replies(messages: tf.Tensor, replies: tf.Tensor) -> tf.Tensor:
    """Each message (batch,) read as the lists read it (normalised, then only its syllables, letters and digits):
    `SELF_HARM_REPLY` where a self-harm stem matches, else `ABUSE_REPLY` where an abuse stem does, else its reply
    (batch,) as it was. One graph function for every entry point."""
    compact = tf.strings.regex_replace(normalize_tf(messages), NOT_COMPACT, "")
    self_harm = tf.strings.regex_full_match(compact, f".*(?:{SELF_HARM_PATTERN}).*")
    abuse = tf.strings.regex_full_match(compact, f".*(?:{ABUSE_PATTERN}).*")
    return tf.where(self_harm, SELF_HARM_REPLY, tf.where(abuse, ABUSE_REPLY, replies))


def crisis_reply(message: str) -> str | None:
    """The crisis reply for one message that may signal self-harm, suicide or abuse, None for any other:
    `crisis_replies` run eagerly."""
    return crisis_replies(tf.constant([message]), tf.constant([""]))[0].numpy().decode("utf-8") or None
