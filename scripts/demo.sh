#!/bin/sh
# make run: llmsd serving its clients. Make has built everything; this takes the trained
# documentation models of the test data (a generator and an embedding model), or without
# them its TinyStories model, or without that a small generated random-weight model
# (MODEL=path.gguf picks any), starts build/llmsd on a socket in a temporary directory
# with a temporary state directory, asks one question with `llms ask`, has a two-turn
# `llms chat`, with the documentation models answers questions over a knowledge base of
# 300 documentation passages with `llms rag` (the second from the QA bank), and stops the
# daemon.
set -eu
build=${BUILD:-build}
data=${LLMS_TESTDATA:-../shared/testdata}

for p in llmsd llms llmsctl mkmodel; do
    if [ ! -x "$build/$p" ]; then
        echo "demo: $build/$p is missing (run make)" >&2
        exit 1
    fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/llmsd-demo.XXXXXX")
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

question="What is a system service?"
first="Hello, who are you?"
second="What did I just ask you?"
stories=$data/models/TinyStories-656K-Q8_0.gguf
docs_lm=$data/models/docs-lm-21M-Q8_0.gguf
docs_embed=$data/models/docs-embed-5M-F16.gguf
pairs=$data/docs/pairs-dev.tsv
embed=
if [ -n "${MODEL:-}" ]; then
    model=$MODEL
    echo "== model: $model"
elif [ -f "$docs_lm" ] && [ -f "$docs_embed" ] && [ -f "$pairs" ]; then
    model=$docs_lm
    embed=$docs_embed
    question="A system service is"
    first="The git commit command"
    second="The git push command"
    cat <<MSG
== model: $model
   embed_model: $embed
   A 21M-parameter model trained on Debian's technical documentation: it continues
   documentation prose; it is not tuned to chat, so it writes about your words rather
   than answering them. The 5M embedding model beside it retrieves passages for RAG.
   For a chat model give any llama, qwen2/qwen3 or gemma/gemma2/gemma3 GGUF file:
   make run MODEL=/path/to/model.gguf
MSG
elif [ -f "$stories" ]; then
    model=$stories
    question="Once upon a time, there was a little girl named Lily."
    first="Once upon a time, a dog found a red ball."
    second="Then the dog ran to the park."
    cat <<MSG
== model: $model
   A tiny model (656K parameters) trained on children's stories: it continues stories,
   it does not answer questions. For a chat model give any llama, qwen2/qwen3 or
   gemma/gemma2/gemma3 GGUF file:   make run MODEL=/path/to/model.gguf
MSG
else
    vocab=$data/vocab/ggml-vocab-llama-spm.gguf
    if [ ! -f "$vocab" ]; then
        echo "demo: $stories or $vocab is needed for the demo (or give MODEL=path.gguf)" >&2
        exit 1
    fi
    model=$build/demo-llama-q8_0.gguf
    [ -f "$model" ] || "$build/mkmodel" -o "$model" --arch llama --dim 256 --layers 4 \
        --heads 8 --kv-heads 4 --ffn 768 --ctx 1024 --type q8_0 --vocab "$vocab" \
        --seed 1 >/dev/null
    cat <<MSG
== model: $model
   A generated llama-shaped model on the llama SentencePiece vocabulary. Its weights are
   RANDOM, so its answers are noise: this demo shows the service (socket, apps,
   contexts, streaming, persistence), not a language model. For real answers give any
   llama, qwen2/qwen3 or gemma/gemma2/gemma3 GGUF file:
   make run MODEL=/path/to/model.gguf
MSG
fi

sock=$tmp/llmsd.sock
cat >"$tmp/llmsd.conf" <<CONF
model = $model
socket = $sock
state_dir = $tmp/state
threads = ${THREADS:-2}
max_tokens = 32
temperature = 0.7
CONF
if [ -n "$embed" ]; then
    echo "embed_model = $embed" >>"$tmp/llmsd.conf"
fi

echo
echo "== starting llmsd (socket $sock)"
"$build/llmsd" --config "$tmp/llmsd.conf" 2>"$tmp/llmsd.log" &
pid=$!
tries=0
while [ ! -S "$sock" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "demo: llmsd exited; its log:" >&2
        cat "$tmp/llmsd.log" >&2
        pid=
        exit 1
    fi
    tries=$((tries + 1))
    if [ "$tries" -gt 300 ]; then
        echo "demo: llmsd did not open its socket within 30 s" >&2
        exit 1
    fi
    sleep 0.1
done

export LLMS_SOCKET=$sock
echo
echo "== llms ask \"$question\""
"$build/llms" --max-tokens 32 --seed 7 ask "$question"

echo
echo "== llms chat: two turns piped on stdin (the context id goes to stderr)"
printf '%s\n%s\n' "$first" "$second" >"$tmp/turns"
sed 's/^/   you:   /' "$tmp/turns"
"$build/llms" --max-tokens 24 --seed 7 chat --system "You are a helpful assistant." \
    <"$tmp/turns" 2>"$tmp/chat.err" | sed 's/^/   reply: /'
cat "$tmp/chat.err"
ctx=$(sed -n 's/^context \([^ ]*\) .*/\1/p' "$tmp/chat.err")

echo
echo "== llms ctx list (the app default, which llms uses without --app, now has one context)"
"$build/llms" ctx list
if [ -n "$ctx" ]; then
    echo
    echo "== llms ctx show $ctx (its stored history)"
    "$build/llms" ctx show "$ctx"
fi

if [ -n "$embed" ]; then
    echo
    echo "== llms kb create docs; llms kb add docs FILE... (300 passages of the test data's"
    echo "   documentation, one file each); llms rag prints an answer, then on stderr the"
    echo "   passages it was given and how the cache answered"
    mkdir "$tmp/docs"
    awk -F '\t' -v dir="$tmp/docs" 'NR > 1 && NR <= 301 {
        f = sprintf("%s/p%03d.txt", dir, NR - 1); print $1 "\n\n" $2 > f; close(f) }' "$pairs"
    "$build/llms" kb create docs
    "$build/llms" kb add docs "$tmp"/docs/*.txt
    for q in "How do I emulate mod_gzip with mod_deflate?" \
             "How can I emulate mod_gzip using mod_deflate?"; do
        echo
        echo "== llms rag docs \"$q\""
        "$build/llms" --max-tokens 32 --seed 7 rag docs "$q" -k 2
    done
    echo
    echo "   The second question is near enough the first (cosine tau_query) to be answered"
    echo "   from the QA bank at once: qa_hit, no prefill and no decode."
fi

echo
echo "== llmsctl status (admin: root or the group llms-admin)"
"$build/llmsctl" status || true

echo
echo "== stopping llmsd (SIGTERM: in-flight calls end, every context is persisted)"
kill -TERM "$pid"
if wait "$pid"; then
    echo "   llmsd exited cleanly"
else
    echo "   llmsd exited with status $?; its log:" >&2
    cat "$tmp/llmsd.log" >&2
    pid=
    exit 1
fi
pid=
