/*
 * test_long_token.c — a token whose text is longer than any fixed piece buffer reaches
 * the client whole: a model made to reply with one 700-byte token (multi-byte characters
 * across the old 256-byte cut) answers it byte for byte, in a whole reply and streamed.
 */
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/toolmodel.h"
#include "tests/support/test.h"

#define T_Q (TOOLMODEL_FIRST_CHAR + 'Q' - ' ')
#define T_EOS 2

/* the prompt's last token ('Q') is followed by the long token, and that by the end */
static const int CHAIN[][2] = {{T_Q, TOOLMODEL_CALL_TOKEN}, {TOOLMODEL_CALL_TOKEN, T_EOS}};

static char llmsd_path[1024], model_path[1024], hsock[1024];
static char long_text[701];
static llmsd_proc daemon_;
static int daemon_up;

/* 700 bytes: ASCII runs with a two-byte "é" and a three-byte "€" straddling bytes 255,
 * 256 and 511 */
static void make_long_text(void)
{
    size_t n = 0;
    while (n < 700) {
        if (n == 254 || n == 510)
            n += (size_t)snprintf(long_text + n, sizeof long_text - n, "\xc3\xa9\xe2\x82\xac");
        else {
            long_text[n] = (char)('a' + n % 26);
            n++;
        }
    }
    long_text[700] = '\0';
}

#define NEED()                                                                 \
    do {                                                                       \
        if (!llmsd_path[0])                                                    \
            SKIP("llmsd is not built in this tree");                           \
        if (!model_path[0])                                                    \
            SKIP("no model could be generated");                               \
        if (!daemon_up)                                                        \
            daemon_up = toolmodel_start(&daemon_, llmsd_path, "longtok", model_path, \
                                        hsock, sizeof hsock) == 0 ? 1 : -1;    \
        CHECK_MSG(daemon_up == 1, "llmsd did not start");                      \
    } while (0)

static void whole_reply_has_the_whole_token(void)
{
    NEED();
    int st;
    json_object *o =
        httpc_post_json(hsock, "/completion", "{\"prompt\":\"Q\",\"n_predict\":8}", &st);
    const char *got = o ? httpc_jstr(o, "content") : NULL;
    CHECK_MSG(st == 200 && got && !strcmp(got, long_text), "%d %zu bytes: %.80s", st,
              got ? strlen(got) : 0, got ? got : "");
    json_object_put(o);
    o = httpc_post_json(hsock, "/v1/completions", "{\"prompt\":\"Q\",\"max_tokens\":8}", &st);
    got = o ? httpc_jstr(o, "choices.0.text") : NULL;
    CHECK_MSG(st == 200 && got && !strcmp(got, long_text), "%d %zu bytes", st,
              got ? strlen(got) : 0);
    json_object_put(o);
}

/* The server-sent events of /completion: each "data: " line's content, joined. */
static void streamed_reply_has_the_whole_token(void)
{
    NEED();
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "POST", "/completion", NULL,
                   "{\"prompt\":\"Q\",\"n_predict\":8,\"stream\":true}", &r) == 0);
    CHECK_EQ(r.status, 200);
    char joined[2048] = "";
    size_t n = 0;
    for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        json_object *ev = json_tokener_parse(line + 6);
        const char *c = ev ? httpc_jstr(ev, "content") : NULL;
        if (c && n + strlen(c) < sizeof joined)
            n += (size_t)snprintf(joined + n, sizeof joined - n, "%s", c);
        json_object_put(ev);
    }
    httpc_reply_free(&r);
    CHECK_MSG(!strcmp(joined, long_text), "%zu bytes: %.80s", n, joined);
}

static void daemon_exits_cleanly(void)
{
    proc_check_clean_exit(&daemon_, &daemon_up);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    make_long_text();
    toolmodel_generate("longtok", long_text, "{{ '<|im_start|>' }}", NULL, NULL, 0, model_path,
                       sizeof model_path);
    if (model_path[0] && toolmodel_make_chain(model_path, CHAIN, 2) != 0)
        model_path[0] = '\0';
    RUN(whole_reply_has_the_whole_token);
    RUN(streamed_reply_has_the_whole_token);
    RUN(daemon_exits_cleanly);
    return test_finish();
}
