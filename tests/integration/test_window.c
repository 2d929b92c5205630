/*
 * test_window.c — a real llmsd with a 64-token window (stories260K, the trained model of
 * the shared test data): a WINDOW conversation goes well past the window several times
 * and keeps answering, its context never holds more than the window, the streamed text
 * is the reply, the store holds no blob beyond the window, and everything survives a
 * restart; a REFUSE context stops with STOP_CONTEXT_FULL and its next call fails with
 * FAILED_PRECONDITION; the daemon's `overflow` setting is the default.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "tests/integration/llmsd_proc.h"

#define CONF "n_ctx = 64\n"

static char llmsd_path[1024], model_path[1024];

static const char *const prompts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "One day she found a big red ball in the park.",
    "She ran home to show her mom.",
    "Her mom smiled and gave her a cookie.",
    "Then they went to the garden to play.",
    "A little bird came and sat on the ball.",
    "Lily laughed and the bird flew away.",
    "At night Lily was tired and went to bed.",
};
#define N_PROMPTS ((int)(sizeof prompts / sizeof prompts[0]))

typedef struct streamed {
    char text[4096];
    size_t len;
} streamed;

static int on_text(const char *text, size_t len, void *user)
{
    streamed *s = user;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    return 0;
}

static int needs_model(void)
{
    if (!llmsd_path[0]) {
        test_skip("llmsd is not built in this tree");
        return 0;
    }
    if (!model_path[0]) {
        test_skip("../shared/testdata/models/stories260K.gguf is absent");
        return 0;
    }
    return 1;
}

/* Chunk files in the state directory of the context, and the highest chunk index among
 * them (-1 when none). */
static int chunk_files(const llmsd_proc *d, const char *id, int *max_index)
{
    char path[1200];
    proc_fmt(path, sizeof path, "%s/state/chunks/%s", d->dir, id);
    *max_index = -1;
    DIR *dir = opendir(path);
    if (!dir)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        int index;
        if (strstr(e->d_name, ".chunk") && sscanf(e->d_name, "%d.", &index) == 1) {
            n++;
            *max_index = index > *max_index ? index : *max_index;
        }
    }
    closedir(dir);
    return n;
}

/* Runs prompts[first, last) on the context: every call answers, the streamed text is
 * the reply, the context holds at most the window. Returns the window's slides. */
static int converse(llms_conn *c, const char *id, int first, int last, int *failed)
{
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = 40;
    int slides = 0;
    for (int i = first; i < last; i++) {
        streamed s = {{0}, 0};
        llms_result r;
        if (llms_call(c, id, prompts[i], &p, on_text, &s, &r) != LLMS_OK) {
            fprintf(stderr, "turn %d: %s\n", i, llms_last_error(c));
            (*failed)++;
            continue;
        }
        if (r.context_tokens > 64 || strcmp(s.text, r.text) != 0 ||
            (r.stop_reason != LLMS_STOP_MAX_TOKENS && r.stop_reason != LLMS_STOP_EOS &&
             r.stop_reason != LLMS_STOP_STRING)) {
            fprintf(stderr, "turn %d: %u tokens, stop %s, streamed '%s' reply '%s'\n", i,
                    r.context_tokens, llms_stop_reason_name(r.stop_reason), s.text, r.text);
            (*failed)++;
        }
        slides += (int)r.window_slides;
        llms_result_free(&r);
    }
    return slides;
}

static void window_conversation_goes_on(void)
{
    if (!needs_model())
        return;
    llmsd_proc d;
    char id[LLMS_ID_MAX];
    int failed = 0;
    CHECK_MSG(proc_start(&d, llmsd_path, "window", model_path, CONF) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "win");
    CHECK(c && llms_context_create(c, "A story.", NULL, id) == LLMS_OK);
    int slides = c ? converse(c, id, 0, N_PROMPTS / 2, &failed) : 0;
    CHECK_EQ(failed, 0);
    CHECK_MSG(slides >= 3, "the window slid %d times", slides);
    llms_context_info info;
    CHECK(c && llms_context_get(c, id, 1, &info) == LLMS_OK);
    CHECK_EQ(info.overflow, LLMS_OVERFLOW_WINDOW);
    CHECK_EQ((int)info.window_slides, slides);
    CHECK(info.n_tokens <= 64 && info.window_dropped_tokens > 64);
    /* The messages keep the whole conversation: system, then user and assistant. */
    CHECK_EQ(info.n_history, (size_t)(1 + 2 * (N_PROMPTS / 2)));
    llms_context_info_free(&info);
    llms_daemon_status st;
    llms_conn *admin = proc_connect(&d, NULL);
    CHECK(admin && llms_status_get(admin, &st) == LLMS_OK);
    CHECK_EQ((int)st.window_slides, slides);
    llms_daemon_status_free(&st);
    llms_close(admin);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);

    /* Every chunk of the window is stored once; nothing beyond it. */
    int max_index, n = chunk_files(&d, id, &max_index);
    CHECK_MSG(n == max_index + 1 && n >= 3 && n <= 4, "%d chunk files, highest %d", n, max_index);

    CHECK_MSG(proc_start(&d, llmsd_path, "window", model_path, CONF) == 0,
              "llmsd did not restart");
    c = proc_connect(&d, "win");
    CHECK(c && llms_context_get(c, id, 0, &info) == LLMS_OK);
    CHECK_EQ((int)info.window_slides, slides);
    CHECK(info.n_tokens <= 64);
    llms_context_info_free(&info);
    int more = c ? converse(c, id, N_PROMPTS / 2, N_PROMPTS, &failed) : 0;
    CHECK_EQ(failed, 0);
    CHECK_MSG(more >= 3, "after the restart the window slid %d times", more);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    n = chunk_files(&d, id, &max_index);
    CHECK_MSG(n == max_index + 1 && n <= 4, "%d chunk files, highest %d", n, max_index);
}

/* A REFUSE context (asked for, or the daemon's default) stops at the window and then
 * refuses; the policy survives a restart. */
static void refuse_stops_and_fails(void)
{
    if (!needs_model())
        return;
    llmsd_proc d;
    char id[LLMS_ID_MAX], id2[LLMS_ID_MAX];
    CHECK_MSG(proc_start(&d, llmsd_path, "refuse", model_path, CONF "overflow = refuse\n") == 0,
              "llmsd did not start");
    llms_conn *c = proc_connect(&d, "ref");
    CHECK(c && llms_context_create_overflow(c, NULL, NULL, LLMS_OVERFLOW_REFUSE, id) == LLMS_OK);
    CHECK(c && llms_context_create(c, NULL, NULL, id2) == LLMS_OK);
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = 200;
    p.raw = 1;
    const char *ids[2] = {id, id2};
    for (int k = 0; k < 2 && c; k++) {
        llms_result r;
        CHECK(llms_call(c, ids[k], prompts[0], &p, NULL, NULL, &r) == LLMS_OK);
        CHECK_MSG(r.stop_reason == LLMS_STOP_CONTEXT_FULL || r.stop_reason == LLMS_STOP_EOS,
                  "stop %s", llms_stop_reason_name(r.stop_reason));
        if (r.stop_reason == LLMS_STOP_CONTEXT_FULL) {
            CHECK_EQ(r.context_tokens, 64);
            CHECK_EQ(r.window_slides, 0);
        }
        llms_result_free(&r);
        /* Turns go on until the window is full, then the context refuses. */
        enum llms_status s = LLMS_OK;
        for (int i = 1; i < N_PROMPTS && s == LLMS_OK; i++) {
            s = llms_call(c, ids[k], prompts[i], &p, NULL, NULL, &r);
            if (s == LLMS_OK)
                llms_result_free(&r);
        }
        CHECK_EQ(s, LLMS_ERR_FAILED_PRECONDITION);
        CHECK_MSG(strstr(llms_last_error(c), "is full") &&
                      strstr(llms_last_error(c), "overflow is refuse"),
                  "%s", llms_last_error(c));
    }
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    CHECK_MSG(proc_start(&d, llmsd_path, "refuse", model_path, CONF) == 0, "llmsd did not restart");
    c = proc_connect(&d, "ref");
    llms_context_info info;
    CHECK(c && llms_context_get(c, id, 0, &info) == LLMS_OK);
    CHECK_EQ(info.overflow, LLMS_OVERFLOW_REFUSE);
    CHECK_EQ(info.window_slides, 0);
    llms_context_info_free(&info);
    CHECK(c && llms_call(c, id, prompts[0], &p, NULL, NULL, NULL) == LLMS_ERR_FAILED_PRECONDITION);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *stories = test_data_path("models/stories260K.gguf");
    if (stories)
        proc_fmt(model_path, sizeof model_path, "%s", stories);
    RUN(window_conversation_goes_on);
    RUN(refuse_stops_and_fails);
    return test_finish();
}
