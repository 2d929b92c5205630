#!/bin/sh
# make run: shows the engine at work. The daemon (llmsd) and its clients come with
# issue 3; until then this runs the engine's own command-line tool, llms-run.
set -eu
data=${LLMS_TESTDATA:-../shared/testdata}
stories=$data/models/stories260K.gguf
vocab=$data/vocab/ggml-vocab-gpt-2.gguf
if [ ! -f "$stories" ] || [ ! -f "$vocab" ]; then
    echo "demo: $data is needed (a trained tiny model and real vocabularies)" >&2
    exit 1
fi

echo "== 1. a trained model (stories260K, llama architecture): greedy generation from BOS"
echo "   (its vocabulary has placeholder pieces, so the output is token ids)"
./build/llms-run -m "$stories" --ids -p 1 -n 48 --temp 0

echo
echo "== 2. the GPT-2 tokenizer on a sentence, and back"
text="llmsd keeps every app's context alive."
ids=$(printf '%s' "$text" | ./build/llms-run -m "$vocab" --tokenize)
echo "   text:  $text"
echo "   ids:   $ids"
echo "   back:  $(echo "$ids" | ./build/llms-run -m "$vocab" --detokenize)"

echo
echo "== 3. a generated qwen2-shaped model on the GPT-2 vocabulary (random weights, so"
echo "   the text is noise), with its chat template, sampling and speed"
model=build/demo-qwen2-q8_0.gguf
[ -f "$model" ] || ./build/mkmodel -o "$model" --arch qwen2 --dim 256 --layers 4 \
    --heads 8 --kv-heads 2 --ffn 768 --ctx 1024 --type q8_0 --vocab "$vocab" --seed 1
./build/llms-run -m "$model" --chat -p "Tell me a story." -n 24 --temp 0.8 --seed 3
