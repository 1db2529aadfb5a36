"""The smoke test's judge: nonsense answers are flagged with a reason, ordinary answers never are.

CLEAN is a corpus of ordinary answers (many languages, code, markup, numbers, short answers); GARBAGE
holds the shapes broken servers really produce: collapse to token 0 ('!'), token and phrase loops,
'#' runs, random token ids decoded by a multilingual BPE vocabulary, undecodable bytes. The figures
the corpus tests assert are the detector's measured false-alarm and detection rates.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatchlab.core.garbage import GarbageKind, GarbageVerdict, detect_garbage

CLEAN: list[str] = [
    # English, short and long
    "Paris.",
    " Paris, the largest city in the country and home to the Eiffel Tower.",
    "Yes.",
    "42",
    "No, that is not correct.",
    "The capital of France is Paris. It has been the seat of government since the 10th century, with a "
    "short interruption during the Second World War when the government moved to Vichy.",
    "It was very, very cold that winter, and the river froze solid for two months.",
    "That's a good, good question: the answer depends on the load.",
    "Wow! That is amazing!! Let me explain why it works.",
    "Really?? I did not know that.",
    # other languages
    "Die Hauptstadt von Frankreich ist Paris. Sie liegt an der Seine und hat etwa 2,1 Millionen Einwohner.",
    "La capitale de la France est Paris, une ville célèbre pour la tour Eiffel et le musée du Louvre.",
    "La capital de Francia es París. ¿Quieres saber más sobre su historia?",
    "A capital da França é Paris, às margens do rio Sena.",
    "Stolicą Francji jest Paryż, położony nad Sekwaną.",
    "Fransa'nın başkenti Paris'tir; şehir Seine Nehri'nin iki yakasına kurulmuştur.",
    "Thủ đô của Pháp là Paris, một thành phố nổi tiếng với tháp Eiffel.",
    "法国的首都是巴黎。巴黎位于塞纳河畔，是法国的政治、经济和文化中心。",
    "我用Python写了一个Web服务，部署在Kubernetes上，用 Redis 做缓存，用 Go 写网关。",
    "フランスの首都はパリです。エッフェル塔やルーヴル美術館で有名で、毎年多くの観光客が訪れます。",
    "Pythonのリスト内包表記を使うと、ループを1行で書けます。例：[x * 2 for x in range(10)]",
    "東京タワーは1958年に完成しました。展望台ではWi-Fiも使えます。",
    "프랑스의 수도는 파리입니다. 파리는 센 강변에 위치해 있습니다.",
    "Python을 사용하면 REST API를 쉽게 만들 수 있습니다. 먼저 FastAPI를 설치하세요.",
    "Столица Франции — Париж. Он расположен на реке Сене, и в нём живёт около 2 млн человек.",
    "Используйте pip install requests, а затем импортируйте модуль в Python и вызовите get().",
    "عاصمة فرنسا هي باريس، وتقع على ضفاف نهر السين.",
    "يمكنك استخدام Python لتحليل البيانات بسهولة.",
    "फ्रांस की राजधानी पेरिस है। यह सीन नदी के किनारे बसा है।",
    "Η πρωτεύουσα της Γαλλίας είναι το Παρίσι.",
    "בירת צרפת היא פריז.",
    "เมืองหลวงของฝรั่งเศสคือปารีส ตั้งอยู่ริมแม่น้ำแซน",
    "Hello in Japanese is こんにちは, in Russian Привет, in Arabic مرحبا, in Hindi नमस्ते, in Thai "
    "สวัสดี and in Korean 안녕하세요.",
    "| Language | Greeting |\n|----------|----------|\n| 日本語 | こんにちは |\n| Русский | Привет |\n"
    "| العربية | مرحبا |\n| 한국어 | 안녕하세요 |",
    "The Russian alphabet starts with а, б, в, г, д; the letter ж sounds like the 's' in 'pleasure'.",
    "The character 水 means water and 火 means fire.",
    "One letter of each script: Latin (A), Greek (Ω), Cyrillic (Ж), Arabic (ع), Hebrew (א), "
    "Devanagari (क), Thai (ก), Hangul (한), Han (字).",
    "In Arabic, 'و' means 'and', 'في' means 'in', and 'من' means 'from'.",
    "こんにちは (konnichiwa) means hello, and ありがとう (arigatō) means thank you.",
    "Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, life is but a dream.",
    "大韓民國(대한민국)은 동아시아에 있는 나라입니다.",
    # maths and science
    "The area of a circle is πr², so with r = 2 m it is about 12.57 m². For θ = 30°, sin θ = 0.5.",
    "The latency dropped from 120 μs to 35 μs after enabling CUDA graphs; λ = 0.01 worked best.",
    "Water is H₂O; the reaction releases 286 kJ/mol at 25 °C and 1 atm (Δ H < 0).",
    "A googol is 1 followed by 100 zeros: 1" + "0" * 100,
    "The population is 68,000,000 and the budget was €1,000,000,000 in 2023.",
    "The null pointer on x86-64 is usually 0x0000000000000000.",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144",
    # code and markup
    "```python\n# compute the total\ndef total(xs: list[int]) -> int:\n    # sum of all items\n    return sum(xs)\n```",
    "##########\n# Setup\n##########\nimport os\n\nBASE = os.environ.get('BASE', '/tmp')\nprint(BASE)\n",
    "## Installation\n\n### From PyPI\n\n```bash\npip install dispatchlab\n```\n\n#### Notes\n\n- needs Python 3.11",
    "if (a != b && !!flag) {\n  console.log('not equal!');\n}\nconst x = !!(y ?? z);",
    "(defun fib (n) (if (< n 2) n (+ (fib (- n 1)) (fib (- n 2)))))",
    '{"name": "Paris", "country": "France", "population": 2102650, "tags": ["capital", "city"]}',
    "[[0, 0, 0], [0, 0, 0], [0, 0, 0]]",
    "tensor([0., 0., 0., 0., 0., 0., 0., 0., 0., 0.])",
    'client = OpenAI(api_key="sk-xxxxxxxxxxxxxxxxxxxxxxxx", base_url="http://localhost:30000/v1")',
    "The regex ^[\\w.+-]+@[\\w-]+\\.[\\w.]+$ matches most e-mail addresses.",
    "See https://docs.python.org/3/library/urllib.request.html#urllib.request.urlopen for details.",
    "# 计算总和\ntotal = sum(values)  # 所有值的和\nprint(f'总计: {total}')",
    "Title\n=====\n\nSome text under the title.\n\n---\n\nMore text.",
    "Contents\n1. Introduction ........ 1\n2. Methods ............. 4\n3. Results ............. 9",
    "- apples\n- bananas\n- cherries\n- dates",
    "Step 1: open the file.\nStep 2: read the lines.\nStep 3: close the file.",
    "def f():\n    pass\n\n\ndef g():\n    pass\n",
    "Ha ha, nice try.",
    "Buffalo buffalo Buffalo buffalo buffalo buffalo Buffalo buffalo is a grammatical English sentence.",
    "Use `--attention-backend triton` on sm_120; FA3 needs sm_90.",
    "😊 Sure! Here is the list: 🍎 apple, 🍌 banana, 🍒 cherry.",
    "Paris\ufffd",
]

GARBAGE: list[tuple[str, GarbageKind]] = [
    ("!!!!!!!!", GarbageKind.PUNCTUATION_RUN),
    ("!" * 64, GarbageKind.PUNCTUATION_RUN),
    (" Paris is the!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", GarbageKind.PUNCTUATION_RUN),
    (" ! ! ! ! ! ! ! ! ! ! ! !", GarbageKind.PUNCTUATION_RUN),
    ("??????????????", GarbageKind.PUNCTUATION_RUN),
    ("！！！！！！！！！！", GarbageKind.PUNCTUATION_RUN),
    ("!?!?!?!?!?!?!?!?!?!?", GarbageKind.PUNCTUATION_RUN),
    (
        "The capital of France is Paris. The capital of Germany is Berlin and!!!!!!!!!!!!!!!!!!!!",
        GarbageKind.PUNCTUATION_RUN,
    ),
    ("########", GarbageKind.HASH_RUN),
    ("################################################################", GarbageKind.HASH_RUN),
    ("## ## ## ## ## ## ## ## ## ##", GarbageKind.HASH_RUN),
    ("the the the the the the the the the the", GarbageKind.REPEATED_TOKEN),
    (" Paris Paris Paris Paris Paris Paris Paris Paris Paris", GarbageKind.REPEATED_TOKEN),
    ("<unk><unk><unk><unk><unk><unk><unk><unk><unk><unk>", GarbageKind.REPEATED_TOKEN),
    ("的的的的的的的的的的的的", GarbageKind.REPEATED_TOKEN),
    ("是是是是是是是是是", GarbageKind.REPEATED_TOKEN),
    ("<|endoftext|><|endoftext|><|endoftext|><|endoftext|><|endoftext|>", GarbageKind.REPEATED_TOKEN),
    (
        " Paris. I am a student. I am a student. I am a student. I am a student. I am a student. I am a",
        GarbageKind.REPEATED_TOKEN,
    ),
    ("of the of the of the of the of the of the of the", GarbageKind.REPEATED_TOKEN),
    (
        " is the capital of the capital of the capital of the capital of the capital of the capital of",
        GarbageKind.REPEATED_TOKEN,
    ),
    ("the of the the and the the the to the the the a the the", GarbageKind.REPEATED_TOKEN),
    ("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", GarbageKind.REPEATED_TOKEN),
    ("0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0", GarbageKind.REPEATED_TOKEN),
    (" Paris\n\nParis\n\nParis\n\nParis\n\nParis\n\nParis\n\nParis\n\nParis", GarbageKind.REPEATED_TOKEN),
    ("дом的ของ مرحبا xq 三 ж ك ข", GarbageKind.MIXED_SCRIPT_NOISE),
    # Random token ids through a Qwen/Llama-3 style byte-level BPE: subword pieces of many scripts,
    # code fragments, odd spacing, glued words.
    (
        " Laboratoriesзов_nat 刊 frustr.pathname ข่าว mobs(); Helsinki לים pursuant 가능 ostat"
        "ическийbeitenClub 县 dış\tmerged'];\n Ек sola",
        GarbageKind.MIXED_SCRIPT_NOISE,
    ),
    (
        'ologia Keyboard тақ Vers 刹 Autowired\u0627\u0644\u062aulta sponsors 의 kör _("кон ئ BUT ή',
        GarbageKind.MIXED_SCRIPT_NOISE,
    ),
    (
        " handwritten pix่อ Sender Spielberg eco_DIRECTORY Кор-lnd 下午 surf Дж Ó veryfalls rng "
        "ulatory.Graphics ಮ 地址 hoje ح 하지만",
        GarbageKind.MIXED_SCRIPT_NOISE,
    ),
    (
        "ifactsерж Plaintiff(dim الموا 的 knex_TRAN भी.getObject Norris 개 ulary ষ Stanton",
        GarbageKind.MIXED_SCRIPT_NOISE,
    ),
    (
        "_WINDOW ש Weekly ал 年 quisit ض أن cuda Rest ი Mall ٹ wik Ж 体 proving ত",
        GarbageKind.MIXED_SCRIPT_NOISE,
    ),
    (
        "Пер总 ellaتر tulajdonGuid Verse_OP ở lungs 자동 ك vreme ۔ Тур Bảo 小说 fallsจะ",
        GarbageKind.MIXED_SCRIPT_NOISE,
    ),
    ("\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd", GarbageKind.MIXED_SCRIPT_NOISE),
    ("Par\ufffd\ufffds \ufffdis th\ufffd cap\ufffdtal", GarbageKind.MIXED_SCRIPT_NOISE),
    ("\x00\x01\x02\x03 abc \x04\x05\x06\x07", GarbageKind.MIXED_SCRIPT_NOISE),
    ("", GarbageKind.EMPTY),
    ("   \n\t  ", GarbageKind.EMPTY),
]


# Hard negatives written apart from the rules: answers whose shapes sit next to a garbage shape (a row
# of emoji, a sung refrain, a nucleotide motif, a spaced '#' banner, a numbered list, emphasis).
HARD_CLEAN: list[str] = [
    "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。故宫、长城和天坛每年吸引数以百万计的游客。",
    "人工知能（AI）は、機械学習やディープラーニングなどの技術を使って、人間のように考えたり判断したりするシステムです。ChatGPTもその一例です。",
    "서울은 대한민국의 수도이며, 약 천만 명이 살고 있습니다. 한강이 도시를 가로질러 흐릅니다. GPU 서버는 H100을 사용합니다.",
    "Москва — столица России. Город расположен на реке Москве; население — около 13 миллионов человек. Запустите сервер командой `vllm serve`.",
    "القاهرة هي عاصمة مصر وأكبر مدنها، ويبلغ عدد سكانها أكثر من عشرين مليون نسمة. يمر نهر النيل عبر المدينة.",
    "```python\nimport numpy as np\n\ndef softmax(x: np.ndarray) -> np.ndarray:\n    e = np.exp(x - x.max())\n    return e / e.sum()\n\nprint(softmax(np.array([1.0, 2.0, 3.0])))\n```",
    '```cpp\n#include <cstdio>\n#include <vector>\n#define N 16\n#define M 32\n#ifdef DEBUG\n#endif\nint main() { std::vector<int> v(N); printf("%d\\n", (int)v.size()); }\n```',
    '#!/bin/bash\n#\n# start.sh\n#\n# Usage: ./start.sh MODEL\n#\nset -euo pipefail\n# # # # # # # # # # # #\npython -m sglang.launch_server --model-path "$1"',
    "| Model | Params | MMLU |\n|:------|-------:|-----:|\n| Llama-3-8B | 8B | 66.6 |\n| Qwen2.5-7B | 7B | 74.2 |\n| Mistral-7B | 7B | 62.5 |",
    "1. Install the driver.\n2. Reboot.\n3. Run `nvidia-smi`.\n4. Install CUDA 12.4.\n5. Install PyTorch.\n6. Install vLLM.\n7. Download the model.\n8. Start the server.\n9. Send a request.\n10. Check the logs.\n11. Done.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20",
    "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12",
    "Sections 1. 2. and 3. of the licence apply.",
    '{"id": 1, "items": [{"name": "a", "qty": 2}, {"name": "b", "qty": 3}], "total": 5, "ok": true}',
    "Let x = 3. Then x² + 2x + 1 = (x + 1)² = 16, and ∫₀¹ x dx = 1/2. Also ∑_{k=1}^{n} k = n(n+1)/2.",
    "The CAG repeat CAGCAGCAGCAGCAGCAGCAGCAGCAGCAGCAGCAGCAGCAG is longer than 36 copies in Huntington's disease.",
    "ATGATGATGATGATGATGATGATGATGATGATG",
    "Fa-la-la-la-la, la-la-la-la! 'Tis the season to be jolly, fa-la-la-la-la, la-la-la-la.",
    "Na na na na, na na na na, hey hey hey, goodbye.",
    "La la la, la la la, la la la la la la la, la la la la la.",
    "4",
    "Paris.",
    "Yes",
    "🙂",
    "🎉🎉🎉 Congratulations! 🎉🎉🎉",
    "👍👍👍👍👍👍👍👍👍👍",
    "Sure! 😊 Here are three fruits: 🍎 apple, 🍌 banana, 🍇 grapes. Enjoy! 🙌",
    "- [ ] write tests\n- [x] fix bug\n- [ ] release\n\n> Note: run `ruff` first.",
    "Very very very very very very very very good question! Let me explain.",
    "def f(x):\n    return x\n\n# ----------------------------------------------------------\n# helpers\n# ----------------------------------------------------------\n",
    "Ответ: 42. Вот код на Python:\n\nprint(6 * 7)  # 42",
    "日本語と English を混ぜて書くこともあります。例えば「GPU のメモリが足りない」など。",
    "Der Kühlschrank ist kaputt, weil der Kompressor überhitzt ist. Rufen Sie den Kundendienst an.",
    "| # | Name | Score |\n|---|------|-------|\n| 1 | Ann | 90 |\n| 2 | Bob | 85 |\n| 3 | Cid | 70 |",
    "# Title\n\n## Section\n\n### Subsection\n\nText.\n\n#### Deeper\n\n##### Deepest\n\n###### Six",
    "ho ho ho ho ho ho ho ho, Merry Christmas!",
]

# Garbage shapes of real threads: '#' pieces scattered mid-line, a list of markers only, a decoder
# hopping between stuck tokens.
MORE_GARBAGE: list[tuple[str, GarbageKind]] = [
    (
        "# -# #\n# # # # # # # # // Seng# # #0xA\n# # # # # #\npackage#\n# # # # # #   #\n#   # #",
        GarbageKind.HASH_RUN,
    ),
    (
        "\n  1.  2.  3.  4.  5.  6.  7.  8.  9.  10.  11.  12.  13.  14.  15.  16.  17.  18.  1",
        GarbageKind.REPEATED_TOKEN,
    ),
    (
        "Let's think step by step. camin " + "camin naman " * 9 + "Encode " * 12 + "zorb " * 10,
        GarbageKind.REPEATED_TOKEN,
    ),
    ("import numpy" + " py" * 20, GarbageKind.REPEATED_TOKEN),
]


@pytest.mark.parametrize("text", HARD_CLEAN)
def test_hard_negative_answers_are_not_called_garbage(text):
    verdict = detect_garbage(text)
    assert not verdict.garbage, verdict.reason


@pytest.mark.parametrize(("text", "kind"), MORE_GARBAGE)
def test_scattered_hashes_empty_lists_and_hopping_loops_are_garbage(text, kind):
    verdict = detect_garbage(text)
    assert verdict.garbage and verdict.kind == kind, verdict.reason


def test_a_loop_the_answer_goes_on_from_is_emphasis_but_a_loop_to_the_end_is_not():
    assert not detect_garbage("Very very very very very very very good question! Let me explain why.").garbage
    assert detect_garbage("Good question! Let me explain why." + " very" * 12).garbage


# Subword pieces as a multilingual byte-level BPE vocabulary holds them, grouped by script with their
# weight in the draw (roughly Llama 3's mix: mostly English and code, a quarter other scripts).
# Pieces are separated by spaces; '·' marks a piece that starts a word (BPE's leading space),
# '⏎' and '⇥' a newline and a tab.
VOCAB_TEXT = """
latin 55: ·the ·and ing tion ·Laboratories ·pursuant ·frustr ologia ·Helsinki ·mobs ulatory ·sponsors
  ·Keyboard ifacts ·Stanton quisit ·Weekly ·proving ·Mall verb ·dicen ·nieuw ção ·über straße ·él ción
  ·Spiel amento keit ·lungs ·Norris ekir ancia ·hoje ·forty
code 15: (); _nat .pathname ']){ -> _TYPE =" .get [] {⏎ ⇥ // _DIRECTORY .getObject :: $( %s ") ++
cjk 6: 的 是 刊 县 年 地址 小说 下午 我们 体 三 考虑 を の です ランザ ッ
cyrillic 6: ·при ения ·кон ическ ·Дж ов ·ж ых ·Тур зов ·сид ал ·Ек ерж
arabic 3: ·ال ية ·من تر ·مرا ·ك ض ·أن ما ·ح
hangul 3: ·가능 의 ·하지만 개 ·자동 에서 를 ·연구 수
thai 2: ของ ข่าว จะ ที่ ก ต่ำ ศาล
indic 3: ·भी ष ·विशेष मर ·ಮ ত ளம் ાह ট ওয়া
other 3: ·ή ι ש לים ·Ο ի ·ნ გ ת ა
"""


def _vocab() -> dict[str, tuple[int, list[str]]]:
    vocab: dict[str, tuple[int, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", VOCAB_TEXT.strip()):
        head, pieces = block.split(":", 1)
        group, weight = head.split()
        unescaped = [
            piece.replace("·", " ").replace("⏎", "\n").replace("⇥", "\t") for piece in pieces.split()
        ]
        vocab[group] = (int(weight), unescaped)
    return vocab


VOCAB = _vocab()


def _random_token_text(rng: random.Random, tokens: int) -> str:
    groups = list(VOCAB)
    weights = [VOCAB[group][0] for group in groups]
    return "".join(rng.choice(VOCAB[rng.choices(groups, weights)[0]][1]) for _ in range(tokens))


def test_no_ordinary_answer_in_the_corpus_is_called_garbage():
    assert len(CLEAN) >= 40
    false_alarms = [(text, detect_garbage(text).reason) for text in CLEAN if detect_garbage(text).garbage]
    assert false_alarms == [], f"{len(false_alarms)}/{len(CLEAN)} false alarms"


def test_every_garbage_sample_is_flagged_with_its_kind():
    assert len(GARBAGE) >= 25
    missed = []
    for text, kind in GARBAGE:
        verdict = detect_garbage(text)
        if not verdict.garbage or verdict.kind != kind:
            missed.append((text, kind, verdict.kind, verdict.reason))
    assert missed == [], f"{len(missed)}/{len(GARBAGE)} missed or misnamed"


def test_random_token_ids_decoded_by_a_multilingual_vocabulary_are_mostly_caught():
    # A random-weight model answers with uniformly random token ids; 32 of them, 300 seeded draws.
    rng = random.Random(0)
    draws = [_random_token_text(rng, 32) for _ in range(300)]
    verdicts = [detect_garbage(text) for text in draws]
    caught = sum(verdict.garbage for verdict in verdicts)
    assert caught / len(draws) >= 0.85, f"caught {caught}/{len(draws)}"
    assert {verdict.kind for verdict in verdicts if verdict.garbage} == {GarbageKind.MIXED_SCRIPT_NOISE}


@pytest.mark.parametrize("text", [text for text, _ in GARBAGE])
def test_a_flagged_answer_says_why_and_scores_high(text):
    verdict = detect_garbage(text)
    assert verdict.reason and verdict.reason != "looks like an ordinary answer"
    assert 0.5 <= verdict.score <= 1.0


def test_the_reason_names_the_repeated_character_and_its_share():
    verdict = detect_garbage(" Paris" + "!" * 40)
    assert verdict.kind == GarbageKind.PUNCTUATION_RUN
    assert "'!'" in verdict.reason and "%" in verdict.reason


def test_the_reason_quotes_the_looping_token():
    verdict = detect_garbage("the " * 12)
    assert verdict.kind == GarbageKind.REPEATED_TOKEN
    assert "'the'" in verdict.reason and "12 times" in verdict.reason


def test_the_reason_lists_the_scripts_of_noise():
    verdict = detect_garbage("дом的ของ مرحبا xq 三 ж ك ข")
    assert "Cyrillic" in verdict.reason and "Thai" in verdict.reason


def test_a_verdict_travels_as_json():
    loud = detect_garbage("!!!!!!!!!!!!").to_dict()
    assert json.loads(json.dumps(loud)) == loud
    assert loud["garbage"] is True and loud["kind"] == "punctuation_run"
    calm = detect_garbage("Paris.").to_dict()
    assert calm["garbage"] is False and calm["kind"] is None and 0 <= calm["score"] < 0.5


def test_a_huge_answer_is_judged_without_reading_all_of_it():
    assert detect_garbage("word " * 1_000_000 + "!" * 10_000).garbage
    essay = " ".join(f"Point {n}: the {n}th argument differs from the one before it." for n in range(3000))
    assert not detect_garbage(essay).garbage


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_any_text_gets_a_verdict_without_raising(text):
    verdict = detect_garbage(text)
    assert isinstance(verdict, GarbageVerdict)
    assert verdict.garbage == (verdict.kind is not None)
    assert 0.0 <= verdict.score <= 1.0
    assert verdict.reason


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([text for text in CLEAN if len(text) > 20]), min_size=1, max_size=4, unique=True)
)
@example(
    [
        "No, that is not correct.",
        next(text for text in CLEAN if text.startswith("Fransa'nın")),
        next(text for text in CLEAN if text.startswith("Thủ đô")),
        next(text for text in CLEAN if text.startswith("See https://docs.python.org")),
    ]
)  # CI found it: a link's path read as forty words of prose with few grammatical ones
def test_ordinary_answers_joined_together_stay_ordinary(parts):
    assert not detect_garbage("\n\n".join(parts)).garbage


# Written by hand from how broken decoding is known to look (issue #18: leaked BPE markers, repeated end
# tokens, loops longer than a phrase), apart from the held-out answers in tests/fixtures/answers.
LEAKS_AND_LONG_LOOPS: list[tuple[str, GarbageKind]] = [
    ("The capital of France is Paris.</s></s></s></s></s>", GarbageKind.REPEATED_TOKEN),
    ("Paris is the capital.<|im_end|><|im_end|><|im_end|><|im_end|>", GarbageKind.REPEATED_TOKEN),
    ("Sure, here it is. <|eot_id|> <|eot_id|> <|eot_id|>", GarbageKind.REPEATED_TOKEN),
    ("The <unk> of <unk> is <unk> and <unk> the <unk>", GarbageKind.TOKENIZER_LEAK),
    ("<0xE4><0xBD><0xA0><0xE5><0xA5><0xBD>", GarbageKind.TOKENIZER_LEAK),
    (
        "<|reserved_special_token_12|><|reserved_special_token_200|><|reserved_special_token_7|>",
        GarbageKind.TOKENIZER_LEAK,
    ),
    ("<extra_id_0><extra_id_1><extra_id_2><extra_id_3>", GarbageKind.TOKENIZER_LEAK),
    ("ĠTheĠcapitalĠofĠFranceĠisĠParis.ĊĠItĠisĠknownĠforĠtheĠEiffelĠTower.", GarbageKind.TOKENIZER_LEAK),
    ("▁The▁capital▁of▁France▁is▁Paris▁and▁it▁is▁big", GarbageKind.TOKENIZER_LEAK),
    (
        "ThatâĢĻs right: the capital is ParisâĢĶknown for itsâĢľlightsâĢĿ and food.",
        GarbageKind.TOKENIZER_LEAK,
    ),
    (
        "The answer is 42. " + "I think the answer should be checked again with the original data. " * 6,
        GarbageKind.REPEATED_TOKEN,
    ),
    (
        "Here is the code:\n" + "print('hello world, this is a test of the loop')\n" * 8,
        GarbageKind.REPEATED_TOKEN,
    ),
    (
        "Step one: open the configuration file and set the port.\n"
        + "Then restart the server and wait for it to load the model weights.\nAfter that, send a request.\n"
        * 5
        + "Then restart the ser",
        GarbageKind.REPEATED_TOKEN,
    ),
    (
        "<think>\nOkay, let me think. "
        + "Wait, let me re-check the calculation of the total cost of the items. " * 5,
        GarbageKind.REPEATED_TOKEN,
    ),
    ("\u200b\u200b\u200b\u200b\u200b\u200b", GarbageKind.EMPTY),
    ("\u3164\u3164 \u2800", GarbageKind.EMPTY),
    ("GGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGGG", GarbageKind.REPEATED_TOKEN),
]

# Ordinary answers that talk about those tokens, quote a loop, or repeat lines on purpose.
TOKENS_AND_REPEATS_CLEAN: list[str] = [
    "The model uses `<|im_start|>` and `<|im_end|>` to mark turns; Llama 3 uses `<|eot_id|>`.",
    "Paris is the capital of France.</s>",
    "Paris is the capital of France.<|im_end|>",
    "In GPT-2's tokenizer, 'Ġ' marks a leading space, so 'Ġthe' is ' the'; SentencePiece uses '▁' instead: '▁the'.",
    "A ChatML conversation looks like:\n<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi"
    "<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
    "```\n<|im_end|><|im_end|><|im_end|>\n```\nThat repeated end token means the stop token is misconfigured.",
    "If the tokenizer sees unknown bytes it emits <unk>; set `byte_fallback` so that <0xE4> style tokens are used.",
    "Use [PAD] for padding and [CLS] at the start in BERT; [SEP] separates the two sentences.",
    "Mojibake example: 'â€™' is what ’ looks like when UTF-8 is read as Windows-1252.",
    "Ġaxija means 'action' in Maltese; Ġgantija is a temple on Gozo.",
    "| Text | Text | Text |\n|---|---|---|\n| Text | Text | Text |\n| Text | Text | Text |\n| Text | Text | Text |",
    "for i in range(3):\n    print('hello world, this is a test of the loop')\nOutput:\nhello world, this is a "
    "test of the loop\nhello world, this is a test of the loop\nhello world, this is a test of the loop",
    "Twinkle, twinkle, little star, how I wonder what you are!\nUp above the world so high, like a diamond in "
    "the sky.\nTwinkle, twinkle, little star, how I wonder what you are!",
    "Row, row, row your boat\nGently down the stream\nMerrily, merrily, merrily, merrily\nLife is but a dream\n"
    "Row, row, row your boat\nGently down the stream\nMerrily, merrily, merrily, merrily\nLife is but a dream",
    "All work and no play makes Jack a dull boy. All work and no play makes Jack a dull boy. That is the "
    "line Jack types in The Shining.",
    "def a():\n    return 1\n\n\ndef b():\n    return 1\n\n\ndef c():\n    return 1\n\n\ndef d():\n    return 1\n",
    "SELECT id FROM users WHERE id = 1;\nSELECT id FROM users WHERE id = 2;\nSELECT id FROM users WHERE id = 3;",
    "The poly(A) tail AAAAAAAAAAAAAAAAAAAA protects the mRNA.",
    "Soft\u00adware with a soft hyphen, and a zero\u200bwidth space inside.",
]


@pytest.mark.parametrize(("text", "kind"), LEAKS_AND_LONG_LOOPS)
def test_leaked_control_tokens_bpe_markers_and_sentence_loops_are_garbage(text, kind):
    verdict = detect_garbage(text)
    assert verdict.garbage and verdict.kind == kind, verdict.reason
    assert 0.5 <= verdict.score <= 1.0


@pytest.mark.parametrize("text", TOKENS_AND_REPEATS_CLEAN)
def test_answers_about_tokens_or_with_a_repeated_line_stay_ordinary(text):
    verdict = detect_garbage(text)
    assert not verdict.garbage, verdict.reason


def test_the_reason_names_the_repeated_control_token_and_the_looping_sentence():
    token = detect_garbage("Done.</s></s></s></s>")
    assert "'</s>'" in token.reason and "4 times" in token.reason
    sentence = detect_garbage("Hi. " + "Wait, let me re-check the calculation of the total cost. " * 5)
    assert "re-check" in sentence.reason and "5 times" in sentence.reason


# Written by hand for issue #18 item 5 (the tuning round on tests/fixtures/answers): shapes seen there,
# rebuilt from how broken decoding looks in general, never copied from an answer.
TUNED_GARBAGE: list[tuple[str, GarbageKind]] = [
    ("Once upon a time, " + "\u200a" * 30, GarbageKind.REPEATED_TOKEN),
    ("ZZZ ZZZZZZ", GarbageKind.REPEATED_TOKEN),
    ("qqqqqqqq7777777777777777777777", GarbageKind.REPEATED_TOKEN),
    ("~).,;'!-+)(&% ,.", GarbageKind.PUNCTUATION_RUN),
    ("Die Antwort ist M\ufffdnchen, nicht K\ufffdln oder Hamburg.", GarbageKind.MIXED_SCRIPT_NOISE),
    ("Paris is the <|reserved_special_token_3|> capital.", GarbageKind.TOKENIZER_LEAK),
    ("<|im_end|>", GarbageKind.TOKENIZER_LEAK),
    (
        "The weather today is sunny and warm. We packed sandwiches, lemonade and a blanket, then set off "
        "early so that we could reach the lake before noon, rent a small boat for an hour, and afterwards "
        "walk slowly back through the village, past the bakery and the church with its tall clock tower, "
        "towards" + " the old park bench" * 8,
        GarbageKind.REPEATED_TOKEN,
    ),
    ("We want want want want to travel travel travel travel home home home home", GarbageKind.REPEATED_TOKEN),
    (
        "mountain forty oxide pencils hyper collision renderer vocational beef schema deriving benefited "
        "varying Autonomous turns became intelligent years paragraph mechanism standalone leading implements "
        "division virtual readymade chlorine commitments cloud multiple gemstone lantern",
        GarbageKind.WORD_SALAD,
    ),
]

# Clean answers next to those shapes: prose of languages whose grammatical words are few or short, titles
# and lists without them, a trailing cut character, invisible joiners where a script needs them.
TUNED_CLEAN: list[str] = [
    "Suomi on pohjoismainen valtio, joka sijaitsee Itämeren rannalla. Maan pääkaupunki on Helsinki, ja siellä "
    "asuu noin kuusisataatuhatta ihmistä. Suomessa on tuhansia järviä, ja metsät peittävät suurimman osan "
    "maasta. Talvet ovat pitkiä ja kylmiä, mutta kesällä aurinko paistaa lähes koko yön.",
    "Türkiye, Avrupa ile Asya arasında yer alan bir ülkedir. Başkenti Ankara olup en kalabalık şehri "
    "İstanbul'dur. Ülkenin kıyıları Karadeniz, Ege ve Akdeniz ile çevrilidir. Türk mutfağı dünyanın en zengin "
    "mutfaklarından biri olarak kabul edilir ve kebap, baklava gibi yemekler çok ünlüdür.",
    "Magyarország fővárosa Budapest, amely a Duna két partján fekszik. A város lakossága körülbelül kétmillió "
    "fő, és az ország gazdasági, kulturális és politikai központja.",
    "Thủ đô của Việt Nam là Hà Nội, một thành phố có lịch sử hơn một nghìn năm. Hà Nội nổi tiếng với những hồ "
    "nước đẹp, các con phố cổ và ẩm thực phong phú.",
    "To enable FP8 quantization, pass the quantization flag when launching the server. The kernel selection "
    "depends on the compute capability of your GPU: Hopper cards use the CUTLASS path, while older "
    "architectures fall back to Marlin.",
    "Breaking News Tonight: Council Approves Downtown Stadium Renovation Budget Increase Amid Growing Public "
    "Concern Over Traffic Congestion Parking Shortages Construction Noise Delays Rising Property Taxes",
    "Tags: python, django, celery, redis, postgres, docker, kubernetes, nginx, gunicorn, sentry, grafana, "
    "prometheus, terraform, ansible, jenkins, github, gitlab, jira, confluence, slack, vault, consul, nomad",
    ":-) :-)",
    "+---+\n|   |\n+---+",
    "می\u200cخواهم به خانه بروم و کتاب\u200cها را بخوانم.",
    "1000000000",
    "Hmmmmmm, let me think about that.",
    "Ha ha ha ha, ha ha ha ha, ha ha ha ha ha! That is a funny one.",
    "[[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]",
    "Tick tock, tick tock, tick tock: the clock on the wall kept time all night.",
    "The answer is M\ufffd",
    "</s>The capital of France is Paris, and it is known for the Eiffel Tower and the Louvre.",
]


@pytest.mark.parametrize(("text", "kind"), TUNED_GARBAGE)
def test_invisible_runs_collapse_stray_slots_late_loops_and_word_salad_are_garbage(text, kind):
    verdict = detect_garbage(text)
    assert verdict.garbage and verdict.kind == kind, verdict.reason
    assert 0.5 <= verdict.score <= 1.0


@pytest.mark.parametrize("text", TUNED_CLEAN)
def test_prose_of_many_languages_titles_lists_and_small_drawings_stay_ordinary(text):
    verdict = detect_garbage(text)
    assert not verdict.garbage, verdict.reason


def test_the_reasons_name_what_was_found():
    assert "U+200A" in detect_garbage("Once upon a time, " + "\u200a" * 30).reason
    assert "unused vocabulary slot" in detect_garbage("Hi <|reserved_special_token_9|> there").reason
    salad = detect_garbage(TUNED_GARBAGE[-1][0])
    assert "grammatical words" in salad.reason and "%" in salad.reason
