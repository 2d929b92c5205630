#!/bin/sh
# make run: shows the engine generating text with the small trained model.
set -eu
model=../shared/testdata/models/stories260K.gguf
if [ ! -f "$model" ]; then
    echo "demo: $model not found (../shared/testdata is needed for the demo model)" >&2
    exit 1
fi
echo "demo: llms-run on $model (greedy, 48 tokens from BOS, printed as token ids)"
./build/llms-run -m "$model" --ids -p "1" -n 48 --temp 0
