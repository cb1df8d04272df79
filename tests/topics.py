"""Everyday, sad and happy questions written for the default model's topic check, none of them in any
training file (a test checks that), each with the words a reply on its topic would use.

A reply is "on topic" when one of its words begins with one of its question's topic words: a word stem of two
syllables or more, or a whole word (Korean endings and particles follow the stem: "먹는", "먹어요" begin with
"먹"... so the stems here are "먹는", "먹어"). Single syllables such as 자, 잘, 일, 비 or 좋 are no topic words:
they begin or sit in words of every topic. Crude, but it separates "맛있는 거 드세요." for a hungry question from
"저도 반가워요." for the same question, which is what users notice.
"""

import re

TOPIC_QUESTIONS = [
    # everyday
    ("점심 메뉴 고르기 너무 어렵다", ("먹는", "먹어", "먹고", "먹을", "맛있", "메뉴", "밥을", "음식", "점심", "드세요")),
    ("요즘 밤에 잠이 잘 안 와", ("잠이", "잠을", "잠들", "자요", "주무", "수면", "꿈을", "누워", "밤에")),
    ("내일 비 온대", ("우산", "비가", "비를", "날씨", "젖어", "장마")),
    ("주말에 집에만 있었더니 심심하다", ("심심", "놀러", "산책", "밖에", "나가", "취미", "영화", "주말")),
    ("운동 시작하려고 해", ("운동", "건강", "몸을", "헬스", "꾸준", "걷기", "시작")),
    ("다음 주가 기말 시험이야", ("시험", "공부", "합격", "노력", "화이팅", "응원")),
    ("회사 일이 너무 많아서 야근해", ("회사", "야근", "퇴근", "피곤", "업무")),
    ("새로 산 옷이 마음에 들어", ("옷이", "옷을", "어울", "예쁘", "예뻐", "멋져", "멋있", "쇼핑")),
    ("목이 칼칼하고 열이 좀 나", ("감기", "목감기", "약을", "병원", "건강", "몸이", "열이", "목이")),
    ("머리를 자를까 고민이야", ("머리", "헤어", "스타일", "잘라", "자르", "미용")),
    # sad / breakup
    ("헤어진 지 한 달 됐는데 아직도 생각나", ("생각", "잊어", "잊을", "잊혀", "이별", "그리워", "그리움", "추억")),
    ("친구들이 다 나를 싫어하는 것 같아", ("친구", "싫어", "오해", "사람", "혼자")),
    ("요즘 너무 외롭고 쓸쓸해", ("외로", "쓸쓸", "혼자", "곁에", "위로")),
    ("면접에서 또 떨어졌어", ("면접", "기회", "결과", "합격", "취업", "실망")),
    ("그 사람한테 연락이 안 와", ("연락", "기다", "전화", "문자", "바쁘", "바쁜")),
    ("이별하고 밥도 못 먹겠어", ("이별", "밥은", "밥을", "먹어", "먹고", "식사", "챙기", "챙겨")),
    ("우울해서 아무것도 하기 싫어", ("우울", "기분", "아무것도")),
    # love / happy
    ("짝사랑하는 사람이 나한테 웃어줬어", ("좋아하", "설레", "마음이", "웃어", "웃음", "사랑", "짝사랑", "고백")),
    ("여자친구랑 백일 됐어", ("축하", "백일", "사랑", "행복", "기념", "선물")),
    ("드디어 취업에 성공했어", ("축하", "취업", "합격", "고생", "잘했", "멋져", "멋있")),
    ("썸 타는 사람이 먼저 연락했어", ("연락", "설레", "좋아하", "관심")),
    ("오늘 고백받았어", ("고백", "축하", "설레", "좋아하", "사랑")),
    ("생일 선물로 꽃을 받았어", ("선물", "꽃을", "꽃이", "축하", "생일", "행복", "기분")),
    ("우리 결혼식 날짜 정해졌어", ("결혼", "축하", "행복", "준비")),
]

WORD = re.compile(r"[가-힣A-Za-z0-9]+")


def words_of(reply: str) -> list[str]:
    return WORD.findall(reply)


def on_topic(reply: str, topic_words) -> bool:
    """Whether a word of `reply` begins with one of `topic_words`."""
    return any(word.startswith(topic) for word in words_of(reply) for topic in topic_words)
