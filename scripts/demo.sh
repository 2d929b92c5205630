#!/bin/sh
# make run: llmsd serving its clients. Make has built everything; this takes the trained
# TinyStories model of the test data (or, without it, generates a small random-weight
# model; MODEL=path.gguf picks any), starts build/llmsd on a socket in a
# temporary directory with a temporary state directory, asks one question with
# `llms ask`, has a two-turn `llms chat`, and stops the daemon.
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
if [ -n "${MODEL:-}" ]; then
    model=$MODEL
    echo "== model: $model"
elif [ -f "$stories" ]; then
    model=$stories
    question="Once upon a time, there was a little girl named Lily."
    first="Once upon a time, a dog found a red ball."
    second="Then the dog ran to the park."
    cat <<MSG
== model: $model
   A tiny model (656K parameters) trained on children's stories: it continues stories,
   it does not answer questions. For a chat model give any llama or qwen2/qwen3 GGUF
   file:   make run MODEL=/path/to/model.gguf
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
   llama or qwen2/qwen3 GGUF file:   make run MODEL=/path/to/model.gguf
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
echo "== llms ctx list (the app llms-cli now has one context)"
"$build/llms" ctx list
if [ -n "$ctx" ]; then
    echo
    echo "== llms ctx show $ctx (its stored history)"
    "$build/llms" ctx show "$ctx"
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
