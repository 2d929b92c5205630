#!/usr/bin/python3
"""
Makes ugm-docs.gguf, a SentencePiece Unigram ("t5" in GGUF) vocabulary laid out as
llama.cpp's converter lays out XLM-RoBERTa's (bge-m3, bge-reranker-v2-m3,
multilingual-e5): <s>, <pad>, </s>, <unk> first, then the model's pieces from its
fourth on, with its NFKC normalizer (the precompiled charsmap) and flags. Also writes
the test cases ugm-docs.gguf.inp and, in ugm-docs.gguf.spm, the ids SentencePiece's own
encoder gives for each, in that layout.

ugm-docs.gguf.out, which test_tokenizer checks, holds llama.cpp's ids instead
(llama_tokenize of llama.cpp of 2026-04 on a bert model of this vocabulary, without
special tokens, as the shared vocab/*.out were made). They equal SentencePiece's on 59
of the 61 cases. On the other two SentencePiece differs from llama.cpp and from
Hugging Face's fast tokenizer: its float sums break a tie between two equal
segmentations of "```````" another way, and it normalizes the user-defined "<ctx>" with
the text around it where the others split it out first.

Run by hand, not by the build: it needs Debian's sentencepiece, python3-sentencepiece
and python3-protobuf, and ../shared/testdata/docs/heldout.txt. The outputs are
committed; regenerating them gives the same vocabulary (one training thread).

    cd tests/engine/data && ./make_ugm_vocab.py ../../../../shared/testdata/docs/heldout.txt
"""
import os
import struct
import subprocess
import sys
import tempfile

os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
import sentencepiece as spm  # noqa: E402
from sentencepiece import sentencepiece_model_pb2 as spm_pb  # noqa: E402

# Lines in other scripts, so that the vocabulary has pieces beyond ASCII: accents,
# Cyrillic, Greek, CJK, Hangul, Arabic and Devanagari.
MULTILINGUAL = """\
Le serveur répond à chaque requête avec un code d'état et un message.
Les modules sont chargés au démarrage; la configuration est relue après un signal.
Der Server antwortet auf jede Anfrage mit einem Statuscode und einer Nachricht.
Über die Konfigurationsdatei lassen sich Module laden und Größen ändern.
El servidor responde a cada petición con un código de estado y un mensaje.
La configuración se lee de nuevo después de una señal; ¿está todo bien?
Сервер отвечает на каждый запрос кодом состояния и сообщением.
Модули загружаются при запуске, а конфигурация перечитывается по сигналу.
Ο διακομιστής απαντά σε κάθε αίτημα με έναν κωδικό κατάστασης.
服务器对每个请求返回状态码和消息。配置文件在收到信号后重新读取。
サーバーは各リクエストにステータスコードとメッセージを返します。
서버는 각 요청에 상태 코드와 메시지로 응답합니다.
يستجيب الخادم لكل طلب برمز حالة ورسالة.
सर्वर हर अनुरोध का उत्तर एक स्थिति कोड और संदेश के साथ देता है।
Cửa Việt là một cửa biển; Führer, naïve, façade, café, coöperate, résumé.
"""

# Cases beyond llama.cpp's usual ones: what the NFKC charsmap folds (full-width letters,
# ligatures, circled digits, no-break and ideographic spaces, compatibility forms),
# whitespace runs, the user-defined piece, and characters the vocabulary lacks.
EXTRA_CASES = [
    "ＡＢＣ ｆｕｌｌ－ｗｉｄｔｈ １２３",
    "ﬁle ﬂow ﬀ ligatures",
    "① ② ⑩ ㈱ ℌ ℡ ™ ½",
    "no\u00a0break\u3000ideographic\u2003em",
    "  leading and trailing  ",
    "a\t\tb\n\nc \r\n d",
    "Le serveur répond à chaque requête.",
    "Über Größen: Straße, STRASSE",
    "服务器返回状态码 and サーバー",
    "서버는 응답합니다 يستجيب सर्वर",
    "the <ctx> piece and<ctx>glued<ctx>",
    "unknown: \u2603\u2603 \U0001F600\U0001F600x \u0e01\u0e02",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5",
    "ｶﾀｶﾅ half-width katakana",
    "Server configuration directives: Listen 80, DocumentRoot /var/www.",
]


def gguf_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, payload):
    return gguf_string(key) + struct.pack("<I", vtype) + payload


U8, U32, I32, F32, BOOL, STRING, ARRAY = 0, 4, 5, 6, 7, 8, 9


def gguf_array(elem_type, items, pack):
    return struct.pack("<IQ", elem_type, len(items)) + b"".join(pack(x) for x in items)


def write_gguf(path, kvs):
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)))
        for kv in kvs:
            f.write(kv)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_ugm_vocab.py HELDOUT.txt")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(sys.argv[1], encoding="utf-8") as src, open(corpus, "w", encoding="utf-8") as out:
            out.write(src.read())
            out.write(MULTILINGUAL * 20)
        prefix = os.path.join(tmp, "ugm")
        subprocess.run(["spm_train", "--input=" + corpus, "--model_prefix=" + prefix,
                        "--model_type=unigram", "--vocab_size=3000",
                        "--user_defined_symbols=<ctx>", "--num_threads=1",
                        "--minloglevel=2"], check=True)
        model = prefix + ".model"
        proto = spm_pb.ModelProto()
        proto.ParseFromString(open(model, "rb").read())
        sp = spm.SentencePieceProcessor(model_file=model)

    # XLM-RoBERTa's ids: fairseq's <s> <pad> </s> <unk>, then piece i at i + 1.
    # SentencePiece numbers its piece types as GGUF does (1 normal ... 6 byte).
    tokens, scores, types = ["<s>", "<pad>", "</s>", "<unk>"], [0.0] * 4, [3, 3, 3, 2]
    for i in range(3, sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(proto.pieces[i].type)

    def to_xlmr(ids):
        return [3 if i == sp.unk_id() else i + 1 for i in ids]

    norm = proto.normalizer_spec
    kvs = [
        gguf_kv("general.architecture", STRING, gguf_string("bert")),
        gguf_kv("general.name", STRING, gguf_string("ugm-docs (test vocabulary)")),
        gguf_kv("tokenizer.ggml.model", STRING, gguf_string("t5")),
        gguf_kv("tokenizer.ggml.pre", STRING, gguf_string("default")),
        gguf_kv("tokenizer.ggml.tokens", ARRAY, gguf_array(STRING, tokens, gguf_string)),
        gguf_kv("tokenizer.ggml.scores", ARRAY, gguf_array(F32, scores, lambda x: struct.pack("<f", x))),
        gguf_kv("tokenizer.ggml.token_type", ARRAY, gguf_array(I32, types, lambda x: struct.pack("<i", x))),
        gguf_kv("tokenizer.ggml.add_space_prefix", BOOL, struct.pack("<?", norm.add_dummy_prefix)),
        gguf_kv("tokenizer.ggml.remove_extra_whitespaces", BOOL,
                struct.pack("<?", norm.remove_extra_whitespaces)),
        gguf_kv("tokenizer.ggml.precompiled_charsmap", ARRAY,
                struct.pack("<IQ", U8, len(norm.precompiled_charsmap)) + norm.precompiled_charsmap),
        gguf_kv("tokenizer.ggml.bos_token_id", U32, struct.pack("<I", 0)),
        gguf_kv("tokenizer.ggml.padding_token_id", U32, struct.pack("<I", 1)),
        gguf_kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", 2)),
        gguf_kv("tokenizer.ggml.unknown_token_id", U32, struct.pack("<I", 3)),
        gguf_kv("tokenizer.ggml.seperator_token_id", U32, struct.pack("<I", 2)),
        gguf_kv("tokenizer.ggml.cls_token_id", U32, struct.pack("<I", 0)),
        gguf_kv("tokenizer.ggml.add_bos_token", BOOL, struct.pack("<?", True)),
        gguf_kv("tokenizer.ggml.add_eos_token", BOOL, struct.pack("<?", True)),
        gguf_kv("tokenizer.ggml.add_sep_token", BOOL, struct.pack("<?", True)),
    ]
    write_gguf("ugm-docs.gguf", kvs)

    shared = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "..", "vocab",
                          "ggml-vocab-llama-spm.gguf.inp")
    sep = "\n__ggml_vocab_test__\n"
    cases = open(shared, encoding="utf-8").read().split(sep)[:-1] + EXTRA_CASES
    with open("ugm-docs.gguf.inp", "w", encoding="utf-8", newline="") as fi, \
            open("ugm-docs.gguf.spm", "w", encoding="utf-8") as fo:
        for c in cases:
            fi.write(c + sep)
            fo.write(" ".join(str(i) for i in to_xlmr(sp.encode(c))) + "\n")


if __name__ == "__main__":
    main()
