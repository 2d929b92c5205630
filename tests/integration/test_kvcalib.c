/*
 * test_kvcalib.c — a layer calibration too long for the end of a call runs in idle time
 * on a real llmsd: the call that begins it returns at once with the calibration waiting
 * (llmsctl status: forwards left), requests that come meanwhile are answered exactly as
 * without it (the calibration's forwards share their runner), the forwards run while the
 * daemon is idle until the model is calibrated, and after a restart the factors come
 * from the store without a second calibration.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/llmsd_proc.h"

static char llmsd_path[1024];
static char model_path[1024];

/* Layers of the generated model; a calibration runs 4 n_layer + 1 forwards. */
#define N_LAYER 8
#define CALIB_FORWARDS (4 * N_LAYER + 1)

/* Every idle period starts this long after the last request (idle_after_ms). */
#define IDLE_AFTER_MS 1000

#define STR_(x) #x
#define STR(x) STR_(x)
#define SETTINGS "kv_calib_inline_ms = 1\nidle_after_ms = " STR(IDLE_AFTER_MS) "\n"

/* A prompt of at least n tokens: the 8 chunks and 32 tokens a calibration needs. */
static char *long_prompt(llms_conn *c, size_t n)
{
    size_t cap = 16 * n + 64, len = 0;
    char *text = malloc(cap);
    if (!text)
        return NULL;
    text[0] = '\0';
    for (int w = 0;; w++) {
        int32_t *tok;
        size_t n_tok;
        if (llms_tokenize(c, text, 1, 0, &tok, &n_tok) != LLMS_OK) {
            free(text);
            return NULL;
        }
        free(tok);
        if (n_tok >= n)
            return text;
        if (len + 16 >= cap) {
            free(text);
            return NULL;
        }
        len += (size_t)snprintf(text + len, cap - len, "%sword%d", w ? " " : "", w % 97);
    }
}

static int greedy_complete(llms_conn *c, const char *prompt, char *out, size_t cap)
{
    llms_params p = proc_greedy(8, NULL);
    llms_result r;
    if (llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r) != LLMS_OK) {
        fprintf(stderr, "complete: %s\n", llms_last_error(c));
        return -1;
    }
    snprintf(out, cap, "%s", r.text);
    llms_result_free(&r);
    return 0;
}

static void idle_calibration(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    if (!model_path[0])
        SKIP("the test model could not be generated");
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "kvcalib", model_path, SETTINGS) == 0,
              "llmsd did not start");
    llms_conn *c = proc_connect(&d, "kvcalib");
    CHECK(c);
    char before[256], during[256];
    CHECK(greedy_complete(c, "a short question", before, sizeof before) == 0);

    char *prompt = long_prompt(c, 8 * 16 + 48);
    CHECK(prompt);
    char id[LLMS_ID_MAX];
    CHECK(llms_context_create(c, NULL, NULL, id) == LLMS_OK);
    llms_params p = proc_greedy(4, NULL);
    p.raw = 1;
    llms_result r;
    CHECK_MSG(llms_call(c, id, prompt, &p, NULL, NULL, &r) == LLMS_OK, "call: %s",
              llms_last_error(c));
    llms_result_free(&r);
    free(prompt);

    /* the call began the calibration and left it for idle time */
    llms_daemon_status st;
    CHECK(proc_status(c, &st) == 0);
    printf("  after the call: %u forwards waiting, %u models calibrated\n",
           st.kv_calib_forwards_left, st.kv_calibrated_models);
    CHECK_EQ(st.kv_calibrated_models, 0);
    CHECK(st.kv_calib_forwards_left > 0 && st.kv_calib_forwards_left <= CALIB_FORWARDS - 1);
    llms_daemon_status_free(&st);

    /* requests keep coming at about the idle threshold, so calibration forwards begin
     * and are given up around them: every answer is the one given before. 50 ms of each
     * gap is idle (a calibration forward of this model takes less; under ThreadSanitizer
     * ten times that) */
    int asked = 0, calibrated = 0;
    double deadline = proc_now() + 120 * TEST_TIME_SCALE;
    while (proc_now() < deadline) {
        usleep((useconds_t)(IDLE_AFTER_MS + 50 * TEST_TIME_SCALE) * 1000);
        CHECK(greedy_complete(c, "a short question", during, sizeof during) == 0);
        CHECK_MSG(strcmp(before, during) == 0, "answer during calibration '%s', before '%s'",
                  during, before);
        asked++;
        CHECK(proc_status(c, &st) == 0);
        calibrated = (int)st.kv_calibrated_models;
        uint32_t left = st.kv_calib_forwards_left;
        uint64_t measured = st.kv_calibrations;
        llms_daemon_status_free(&st);
        if (calibrated) {
            CHECK_EQ(left, 0);
            CHECK_EQ(measured, 1);
            break;
        }
    }
    printf("  calibrated in idle time after %d requests in between\n", asked);
    CHECK_MSG(calibrated == 1, "the calibration did not finish in idle time");
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);

    /* a restart takes the factors from the store */
    CHECK_MSG(proc_start(&d, llmsd_path, "kvcalib", model_path, SETTINGS) == 0,
              "llmsd did not restart");
    c = proc_connect(&d, "kvcalib");
    CHECK(c);
    CHECK(proc_status(c, &st) == 0);
    CHECK_EQ(st.kv_calibrated_models, 1);
    CHECK_EQ(st.kv_calib_forwards_left, 0);
    CHECK_EQ(st.kv_calibrations, 0);
    llms_daemon_status_free(&st);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {
        .arch = "llama", .dim = 256, .n_layer = N_LAYER, .n_head = 8, .n_head_kv = 4,
        .n_ff = 768, .n_ctx = 512, .type = QTYPE_Q8_0, .seed = 21, .n_vocab = 300,
        .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "calib.gguf", &mp);
    RUN(idle_calibration);
    return test_finish();
}
