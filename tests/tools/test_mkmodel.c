/*
 * test_mkmodel.c — mkmodel --from: converting a model file's weights to another type.
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/support/test.h"

static char mkmodel_path[1024];
static char q8_path[1100], f32_path[1100], back_path[1100];

/* Runs mkmodel with args; its exit status, its stderr in err. */
static int mkmodel(const char *args, char *err, size_t cap)
{
    char cmd[6144];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 >/dev/null", mkmodel_path, args);
    return test_run_capture(cmd, err, cap);
}

/* A Q8_0 model converted to F32 holds exactly the dequantized values, its norms and
 * metadata unchanged; converted back to Q8_0 it is the original, byte for byte (a Q8_0
 * block's maximum decodes to 127 * d exactly, so quantizing again finds the same d). */
static void q8_0_to_f32_and_back(void)
{
    char args[4096], err[1024];
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32", f32_path, q8_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type q8_0", back_path, f32_path);
    CHECK_MSG(mkmodel(args, err, sizeof err) == 0, "mkmodel: %s", err);

    char e[ERR_MAX];
    gguf_file *q = gguf_open(q8_path, e), *f = gguf_open(f32_path, e), *b = gguf_open(back_path, e);
    CHECK_MSG(q && f && b, "%s", e);
    CHECK_EQ(gguf_n_kv(f), gguf_n_kv(q));
    CHECK_EQ(gguf_n_tensors(f), gguf_n_tensors(q));
    int converted = 0;
    float row[4096];
    for (int64_t i = 0; i < gguf_n_tensors(q); i++) {
        const gguf_tensor *tq = gguf_tensor_at(q, i), *tf = gguf_tensor_at(f, i),
                          *tb = gguf_tensor_at(b, i);
        CHECK(tq->name.len == tf->name.len && !memcmp(tq->name.ptr, tf->name.ptr, tq->name.len));
        CHECK(tq->n_dims == tf->n_dims && !memcmp(tq->ne, tf->ne, sizeof tq->ne));
        CHECK_EQ(tb->type, tq->type);
        CHECK_MSG(tb->bytes == tq->bytes && !memcmp(tb->data, tq->data, tq->bytes),
                  "%.*s differs after the round trip", (int)tq->name.len, tq->name.ptr);
        if (tq->type != QTYPE_Q8_0) {
            CHECK(tf->type == tq->type && !memcmp(tf->data, tq->data, tq->bytes));
            continue;
        }
        CHECK_EQ(tf->type, QTYPE_F32);
        int64_t n = tq->ne[0], rows = tq->ne[1];
        CHECK(n <= (int64_t)(sizeof row / sizeof row[0]));
        for (int64_t r = 0; r < rows; r++) {
            quant_dequantize_row_scalar(QTYPE_Q8_0,
                                        (const uint8_t *)tq->data + r * quant_row_bytes(QTYPE_Q8_0, n),
                                        row, n);
            CHECK(!memcmp(row, (const float *)tf->data + r * n, sizeof(float) * (size_t)n));
        }
        converted++;
    }
    CHECK_MSG(converted >= 9, "only %d matrices were Q8_0", converted);
    gguf_close(q), gguf_close(f), gguf_close(b);
}

/* Mistakes are refused with a message, and nothing is left behind. */
static void bad_conversions_are_refused(void)
{
    char args[4096], err[1024], out[1100];
    snprintf(out, sizeof out, "%s/never.gguf", test_tmpdir());
    snprintf(args, sizeof args, "-o '%s' --from '%s/missing.gguf' --type f32", out, test_tmpdir());
    CHECK_EQ(mkmodel(args, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "missing.gguf"), "%s", err);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type q4_k_m", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --from '%s' --type f32 --arch llama", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    snprintf(args, sizeof args, "-o '%s' --from '%s'", out, q8_path);
    CHECK_EQ(mkmodel(args, err, sizeof err), 2);
    FILE *left = fopen(out, "r");
    CHECK(left == NULL);
}

int main(int argc, char **argv)
{
    (void)argc;
    char self[1024];
    snprintf(self, sizeof self, "%s", argv[0]);
    /* build/tests/tools/test_mkmodel -> build/mkmodel */
    snprintf(mkmodel_path, sizeof mkmodel_path, "%s/../../mkmodel", dirname(self));
    snprintf(q8_path, sizeof q8_path, "%s/q8.gguf", test_tmpdir());
    snprintf(f32_path, sizeof f32_path, "%s/f32.gguf", test_tmpdir());
    snprintf(back_path, sizeof back_path, "%s/back.gguf", test_tmpdir());
    modelgen_params mp = {.arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
                          .n_ff = 128, .n_ctx = 256, .type = QTYPE_Q8_0, .seed = 3,
                          .n_vocab = 300, .n_threads = 1};
    char err[ERR_MAX];
    if (modelgen_write(&mp, q8_path, err) < 0) {
        fprintf(stderr, "modelgen: %s\n", err);
        return 1;
    }
    RUN(q8_0_to_f32_and_back);
    RUN(bad_conversions_are_refused);
    return test_finish();
}
