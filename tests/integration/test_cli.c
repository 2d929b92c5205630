/*
 * The llms and llmsctl programs of this build against a real llmsd: ask, a piped
 * two-turn chat resumed with --context, ctx list/show/rm, llmsctl's text and --json
 * output (strings escaped, errors as one JSON object), kb add's progress bar (on a
 * terminal only) and its refusal of two files of one name, rag's exit status (a cut answer, an interrupted one) and closed standard
 * streams.
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/tok/utf8.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static char llmsd_path[1024], llms_path[1100], llmsctl_path[1100];
static char model_path[1024];
static char slow_model_path[1024]; /* bigger: a reply of it takes long enough to cut */
static llmsd_proc llmsd;
static int llmsd_up; /* 1 up, -1 failed to start */

/* Runs a shell command; stdout into out, stderr into err_out (either may be NULL). */
static int run(const char *cmd, char *out, size_t cap, char *err_out, size_t err_cap)
{
    char full[8192], err_file[700];
    proc_fmt(err_file, sizeof err_file, "%s/stderr.txt", test_tmpdir());
    proc_fmt(full, sizeof full, "( %s ) 2>'%s'", cmd, err_file);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t len = 0;
    char sink[256];
    if (out) {
        while (len + 1 < cap) {
            size_t got = fread(out + len, 1, cap - 1 - len, p);
            if (got == 0)
                break;
            len += got;
        }
        out[len] = '\0';
    }
    while (fread(sink, 1, sizeof sink, p) > 0)
        ;
    int status = pclose(p);
    if (err_out) {
        FILE *f = fopen(err_file, "r");
        size_t n = f ? fread(err_out, 1, err_cap - 1, f) : 0;
        err_out[n] = '\0';
        if (f)
            fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define NEED_DAEMON()                                                                \
    do {                                                                             \
        if (!llmsd_path[0])                                                          \
            SKIP("llmsd is not built in this tree");                                 \
        if (!llmsd_up)                                                              \
            llmsd_up = model_path[0] && proc_start(&llmsd, llmsd_path, "cli",      \
                                                    model_path, "max_tokens = 8\n") == 0 \
                            ? 1                                                      \
                            : -1;                                                    \
        CHECK_MSG(llmsd_up == 1, "llmsd did not start");                            \
    } while (0)

static void ask_prints_an_answer(void)
{
    NEED_DAEMON();
    char cmd[4096], out[4096], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --temp 0 --max-tokens 5 ask 'Hello there'",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "llms ask failed: %s", err);
    size_t n = strlen(out);
    CHECK_MSG(n > 1 && out[n - 1] == '\n', "answer: '%s'", out);
    /* Nothing is kept by ask. */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' ctx list", llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(out[0] == '\0', "ask left contexts: %s", out);
}

/* llmsd serves a phi3 model as Phi-4-mini is made (partial rotary, LongRoPE factors, the
 * output tied; a window shorter than its context, which caps it) and a granite one: an
 * answer comes back through llms ask. */
static void serves_phi3_and_granite(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *archs[] = {"phi3", "granite"};
    for (int a = 0; a < 2; a++) {
        bool phi3 = a == 0;
        modelgen_params mp = {
            .arch = archs[a], .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
            .n_ff = 128, .n_ctx = 512, .type = QTYPE_F32, .seed = 5, .n_vocab = 300,
            .n_threads = 1, .tie_output = true, .rope_dims = phi3 ? 12 : 0,
            .rope_orig_ctx = phi3 ? 128 : 0, .sliding_window = phi3 ? 256 : 0,
        };
        char path[1024], cmd[4096], out[4096], err[4096];
        proc_generate_model(path, sizeof path, phi3 ? "phi3.gguf" : "granite.gguf", &mp);
        llmsd_proc d;
        CHECK_MSG(proc_start(&d, llmsd_path, archs[a], path, "max_tokens = 8\n") == 0,
                  "llmsd did not start with a %s model", archs[a]);
        proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --temp 0 --max-tokens 5 ask 'Hello there'",
                 llms_path, d.sock);
        int rc = run(cmd, out, sizeof out, err, sizeof err);
        size_t n = strlen(out);
        char status[4096] = "", want[64];
        proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json status", llmsctl_path, d.sock);
        int rc_status = run(cmd, status, sizeof status, NULL, 0);
        CHECK_EQ(proc_stop(&d, SIGTERM), 0);
        CHECK_MSG(rc == 0, "%s: llms ask failed: %s", archs[a], err);
        CHECK_MSG(n > 1 && out[n - 1] == '\n', "%s: answer '%s'", archs[a], out);
        /* the window (256) caps the configured 512 */
        proc_fmt(want, sizeof want, "\"model_arch\":\"%s\"", archs[a]);
        CHECK_MSG(rc_status == 0 && strstr(status, want), "status: %s", status);
        CHECK_MSG(strstr(status, phi3 ? "\"n_ctx\":256" : "\"n_ctx\":512"), "status: %s",
                  status);
    }
}

/* --format json reaches the daemon: the test model's vocabulary ("tokN") has no token
 * that begins a JSON object, and the daemon says so. */
static void ask_format_json_reaches_the_daemon(void)
{
    NEED_DAEMON();
    char cmd[4096], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 4 --format json ask 'Hi'",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) != 0 && strstr(err, "JSON mode"), "%s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 2 --format text ask 'Hi'",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) == 0, "%s", err);
    /* --schema FILE: the daemon compiles it (a keyword it cannot enforce is named), then
     * JSON mode meets this vocabulary as above */
    char schema[700];
    proc_fmt(schema, sizeof schema, "%s/cli-schema.json", test_tmpdir());
    proc_fmt(cmd, sizeof cmd, "printf '{\"type\":\"array\",\"uniqueItems\":true}' > '%s' && "
             "'%s' --socket '%s' --max-tokens 4 ask --schema '%s' 'Hi'", schema, llms_path,
             llmsd.sock, schema);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) != 0 && strstr(err, "'uniqueItems'"), "%s", err);
    proc_fmt(cmd, sizeof cmd, "printf '{\"type\":\"array\"}' > '%s' && '%s' --socket '%s' "
             "--max-tokens 4 ask --schema '%s' 'Hi'", schema, llms_path, llmsd.sock, schema);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) != 0 && strstr(err, "JSON mode"), "%s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' ask --schema '%s' --format json 'Hi'",
             llms_path, llmsd.sock, schema);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) != 0 && strstr(err, "give one of them"), "%s",
              err);
}

/* --grammar FILE: the reply is a sentence of it (the test vocabulary's "tokN" tokens),
 * a grammar that does not compile is named, and one reply format at a time. */
static void ask_grammar_reaches_the_daemon(void)
{
    NEED_DAEMON();
    char cmd[4096], out[4096], err[4096], gbnf[700];
    proc_fmt(gbnf, sizeof gbnf, "%s/cli.gbnf", test_tmpdir());
    proc_fmt(cmd, sizeof cmd, "printf 'root ::= (\"tok\" [0-9]{1,5}){1,3}\\n' > '%s' && "
             "'%s' --socket '%s' --temp 0 --max-tokens 3 ask --grammar '%s' 'Hi'", gbnf,
             llms_path, llmsd.sock, gbnf);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s", err);
    regex_t re;
    CHECK(regcomp(&re, "^(tok[0-9]{1,5}){1,3}\n$", REG_EXTENDED | REG_NOSUB) == 0);
    CHECK_MSG(regexec(&re, out, 0, NULL, 0) == 0, "'%s'", out);
    regfree(&re);
    proc_fmt(cmd, sizeof cmd, "printf 'root ::= item\\n' > '%s' && '%s' --socket '%s' ask "
             "--grammar '%s' 'Hi'", gbnf, llms_path, llmsd.sock, gbnf);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) != 0 && strstr(err, "'item'"), "%s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' ask --grammar '%s' --schema '%s' 'Hi'",
             llms_path, llmsd.sock, gbnf, gbnf);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) != 0 && strstr(err, "give one of them"), "%s",
              err);
}

static void chat_resumes_and_ctx_commands(void)
{
    NEED_DAEMON();
    char cmd[4096], out[8192], err[4096];
    proc_fmt(cmd, sizeof cmd,
             "printf 'first question\\nsecond question\\n' | '%s' --socket '%s' --app cli-chat "
             "--temp 0 --max-tokens 4 chat --system \"$(printf 'be \"brief\"\\t\\\\ok')\"",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "llms chat failed: %s", err);
    char id[LLMS_ID_MAX];
    CHECK_MSG(sscanf(err, "context %127s", id) == 1, "no context id on stderr: %s", err);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    CHECK_MSG(lines >= 2, "two replies expected, got: '%s'", out);

    /* Resume: a third turn lands in the same context. */
    proc_fmt(cmd, sizeof cmd,
             "echo 'third question' | '%s' --socket '%s' --app cli-chat --max-tokens 4 "
             "chat --context %s",
             llms_path, llmsd.sock, id);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "resume failed: %s", err);
    CHECK_MSG(!strstr(err, "context "), "resuming created a context: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-chat ctx show %s", llms_path,
             llmsd.sock, id);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(strstr(out, "first question") && strstr(out, "third question") &&
                  strstr(out, "[assistant]"),
              "history: %s", out);

    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-chat ctx list", llms_path,
             llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK(strstr(out, id) != NULL);
    /* Another app does not see it. */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app someone-else ctx show %s", llms_path,
             llmsd.sock, id);
    CHECK(run(cmd, out, sizeof out, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "NOT_FOUND"), "stderr: %s", err);

    /* llmsctl sees it, with the system prompt escaped in JSON. */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json contexts", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(!strncmp(out, "{\"contexts\":[", 13) && strstr(out, id), "json: %s", out);
    /* The system prompt holds quotes, a tab and a backslash. */
    CHECK_MSG(strstr(out, "\"system_prompt\":\"be \\\"brief\\\"\\t\\\\ok\""), "json: %s",
              out);
    CHECK_MSG(strstr(out, "\"app_name\":\"cli-chat\""), "json: %s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json show %s", llmsctl_path, llmsd.sock,
             id);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(out[0] == '{' && strstr(out, id) &&
                  strstr(out, "\"history\":[{\"role\":\"system\"") &&
                  strstr(out, "{\"role\":\"user\",\"content\":\"third question\"}"),
              "json: %s", out);

    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-chat ctx rm %s", llms_path,
             llmsd.sock, id);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-chat ctx list", llms_path,
             llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK(strstr(out, id) == NULL);

    /* An administrator removes any app's context. */
    proc_fmt(cmd, sizeof cmd, "printf 'hi\\n' | '%s' --socket '%s' --app cli-other --temp 0 "
             "--max-tokens 2 chat", llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 0);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-other ctx list", llms_path,
             llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    char other[LLMS_ID_MAX] = "";
    sscanf(out, "%63s", other);
    CHECK_MSG(other[0], "no context listed: %s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' rm %s", llmsctl_path, llmsd.sock, other);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "llmsctl rm: %s", err);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) != 0 && strstr(err, "NOT_FOUND"),
              "llmsctl rm twice: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-other ctx list", llms_path,
             llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(!strstr(out, other), "still listed: %s", out);
}

static void llmsctl_reports(void)
{
    NEED_DAEMON();
    char cmd[4096], out[8192], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' status", llmsctl_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "status: %s", err);
    CHECK_MSG(strstr(out, "llama") && strstr(out, model_path), "status: %s", out);

    /* a report that could not be written is a failure */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' status > /dev/full", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, NULL, 0, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "llmsctl: writing the output failed"), "stderr: %s", err);

    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json status", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(out[0] == '{' && strstr(out, "\"model_arch\":\"llama\"") &&
                  strstr(out, "\"n_ctx\":512") && !strchr(strchr(out, '\n') + 1, '\n'),
              "json: %s", out);

    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json apps", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(!strncmp(out, "{\"apps\":[", 9), "json: %s", out);

    /* Errors: one JSON object on stdout, a message on stderr, exit status 1. */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json evict no-such-context", llmsctl_path,
             llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 1);
    CHECK_MSG(!strncmp(out, "{\"error\":{\"code\":\"NOT_FOUND\"", 28), "json: %s", out);
    CHECK(err[0] != '\0');
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s/none' --json status", llmsctl_path,
             test_tmpdir());
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 1);
    CHECK_MSG(!strncmp(out, "{\"error\":{\"code\":\"IO\"", 21), "json: %s", out);

    /* shutdown: the llmsd exits cleanly. */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' shutdown", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    int status;
    CHECK(waitpid(llmsd.pid, &status, 0) == llmsd.pid);
    llmsd.pid = 0;
    llmsd_up = -1;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int check_piece(const char *text, size_t len, void *user)
{
    int *all_valid = user;
    *all_valid &= utf8_valid(text, len);
    return 0;
}

/* A random-weight model on a byte-fallback vocabulary produces token sequences that
 * are no UTF-8 (a lone continuation byte, a character cut short); every streamed piece,
 * the result and the stored history are valid UTF-8 all the same, with U+FFFD where
 * the bytes were invalid. */
static void streamed_text_is_valid_utf8(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *vocab_path = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!vocab_path)
        SKIP("test data vocab/ggml-vocab-llama-spm.gguf is absent");
    char err[ERR_MAX], path[700];
    gguf_file *vocab = gguf_open(vocab_path, err);
    CHECK_MSG(vocab, "%s", err);
    proc_fmt(path, sizeof path, "%s/spm.gguf", test_tmpdir());
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 3, .vocab = vocab, .n_threads = 1,
    };
    int rc = modelgen_write(&mp, path, err);
    gguf_close(vocab);
    CHECK_MSG(rc == 0, "modelgen: %s", err);
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "utf8", path, NULL) == 0);
    llms_conn *c = proc_connect(&d, "utf8");
    CHECK(c);
    int replaced = 0, all_valid = 1;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        llms_params p = LLMS_PARAMS_INIT;
        p.temperature = 1.5f;
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
        p.max_tokens = 200;
        p.has_seed = 1;
        p.seed = seed;
        char id[LLMS_ID_MAX];
        CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
        llms_result r;
        CHECK_EQ(llms_call(c, id, "Hello", &p, check_piece, &all_valid, &r), LLMS_OK);
        all_valid &= utf8_valid(r.text, strlen(r.text));
        replaced += strstr(r.text, "\xef\xbf\xbd") != NULL;
        llms_result_free(&r);
        llms_context_info info;
        CHECK_EQ(llms_context_get(c, id, 1, &info), LLMS_OK);
        for (size_t i = 0; i < info.n_history; i++)
            all_valid &= utf8_valid(info.history[i].content, strlen(info.history[i].content));
        llms_context_info_free(&info);
    }
    CHECK_MSG(all_valid, "a piece, a result or the history was not valid UTF-8");
    CHECK_MSG(replaced > 0, "no reply had invalid bytes to replace: the test shows nothing");
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* A user turn of invalid UTF-8 is stored as sent; llmsctl --json still prints valid
 * UTF-8 JSON, with U+FFFD for the bad bytes. */
static void json_of_invalid_utf8_history_is_valid(void)
{
    NEED_DAEMON();
    char cmd[4096], out[16384], err[4096];
    proc_fmt(cmd, sizeof cmd,
             "printf 'bad \\201 byte \\303\\n' | '%s' --socket '%s' --app cli-bytes "
             "--temp 0 --max-tokens 4 chat",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "llms chat failed: %s", err);
    char id[LLMS_ID_MAX];
    CHECK_MSG(sscanf(err, "context %127s", id) == 1, "no context id on stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json show %s", llmsctl_path, llmsd.sock,
             id);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(utf8_valid(out, strlen(out)), "not UTF-8: %s", out);
    CHECK_MSG(strstr(out, "\"content\":\"bad \\ufffd byte \\ufffd\""), "json: %s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json contexts", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(utf8_valid(out, strlen(out)), "not UTF-8: %s", out);
}

/* Path of a program beside llmsd (valid until the next call). */
static const char *program(const char *name)
{
    static char path[1200];
    int dir_len = (int)strlen(llmsd_path) - (int)strlen("llmsd");
    proc_fmt(path, sizeof path, "%.*s%s", dir_len, llmsd_path, name);
    return path;
}

/* --help goes to stdout with exit status 0, --version prints the one version string. */
static void help_and_version(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    static const char *const names[] = {"llms", "llmsctl", "llmsd", "mkmodel", "llms-run"};
    char cmd[4096], out[8192], err[4096], want[64];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        proc_fmt(cmd, sizeof cmd, "'%s' --help", program(names[i]));
        CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s --help: %s", names[i],
                  err);
        CHECK_MSG(strstr(out, "usage") && !err[0], "%s --help: out '%s' err '%s'", names[i],
                  out, err);
        proc_fmt(cmd, sizeof cmd, "'%s' --version", program(names[i]));
        CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s --version", names[i]);
        proc_fmt(want, sizeof want, "%s %s\n", names[i], LLMS_VERSION);
        CHECK_MSG(!strcmp(out, want), "%s --version: '%s'", names[i], out);
    }
    /* llmsctl's usage has one line per command. */
    proc_fmt(cmd, sizeof cmd, "'%s' --help", llmsctl_path);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    static const char *const commands[] = {"\n  status ",  "\n  apps ",    "\n  contexts ",
                                           "\n  show ",    "\n  evict ",   "\n  profile ",
                                           "\n  shutdown ", "\n  rerank-calibrate "};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        CHECK_MSG(strstr(out, commands[i]), "llmsctl --help lacks%s: %s", commands[i], out);
}

/* A bad value names its option and says why, in a line or two rather than the usage. */
static void bad_values_name_the_option(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    static const struct {
        const char *args, *needle;
    } cases[] = {
        {"--max-tokens 1e12 ask hi", "--max-tokens"},
        {"--max-tokens 0 ask hi", "--max-tokens"},
        {"--temp abc ask hi", "--temp"},
        {"--seed -1 ask hi", "--seed"},
        {"--pooling median embed hi", "--pooling"},
        {"--context abc ask hi", "--context"},
        {"--pooling mean ask hi", "--pooling"},
        {"-f /dev/null ask hi", "-f"},
        {"ask one two", "one prompt"},
        {"--format yaml ask hi", "--format"},
        {"--format json embed hi", "--format"},
    };
    char cmd[4096], err[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        proc_fmt(cmd, sizeof cmd, "'%s' %s </dev/null", llms_path, cases[i].args);
        CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) == 2, "llms %s: not a usage error",
                  cases[i].args);
        int lines = 0;
        for (const char *e = err; *e; e++)
            lines += *e == '\n';
        CHECK_MSG(strstr(err, cases[i].needle) && !strstr(err, "usage:") && lines <= 2,
                  "llms %s: %s", cases[i].args, err);
    }
    proc_fmt(cmd, sizeof cmd, "'%s' rerank-calibrate --precision 2 set.txt", llmsctl_path);
    CHECK_EQ(run(cmd, NULL, 0, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "--precision") && !strstr(err, "usage:"), "llmsctl: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' evict", llmsctl_path);
    CHECK_EQ(run(cmd, NULL, 0, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "evict") && !strstr(err, "usage:"), "llmsctl: %s", err);
}

/* The "prompt N tokens" count of llms' stop line, or -1. */
static long prompt_tokens(const char *err)
{
    const char *p = strstr(err, "prompt ");
    return p ? strtol(p + 7, NULL, 10) : -1;
}

/* ask takes its prompt from the argument, from stdin (- or a pipe) and from -f FILE,
 * and a prompt longer than any argument list; --system adds to it. */
static void ask_reads_stdin_and_files(void)
{
    NEED_DAEMON();
    char cmd[8192], out[4096], err[4096], file[700];
    const char *text = "one two three four five six seven eight nine ten";
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 1 ask '%s'", llms_path,
             llmsd.sock, text);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "ask: %s", err);
    long want = prompt_tokens(err);
    CHECK_MSG(want > 10, "stderr: %s", err);
    /* --system is part of ask's prompt, not ignored */
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 1 --system 'Be terse.' ask '%s'",
             llms_path, llmsd.sock, text);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "ask --system: %s", err);
    CHECK_MSG(prompt_tokens(err) > want, "ask --system: %s", err);
    proc_fmt(file, sizeof file, "%s/prompt.txt", test_tmpdir());
    FILE *f = fopen(file, "w");
    CHECK(f);
    fprintf(f, "%s\n", text);
    fclose(f);
    const char *ways[] = {"ask < '%s'", "ask - < '%s'", "ask -f '%s' </dev/null"};
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        char how[1024];
        proc_fmt(how, sizeof how, ways[i], file);
        proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 1 %s", llms_path, llmsd.sock,
                 how);
        CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "%s: %s", how, err);
        CHECK_MSG(prompt_tokens(err) == want, "%s: %s", how, err);
    }
    /* 128 KiB reach the daemon (which finds them too long for its window or frame). */
    proc_fmt(cmd, sizeof cmd,
             "head -c 131072 /dev/zero | tr '\\0' 'a' | '%s' --socket '%s' ask", llms_path,
             llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "INVALID_ARGUMENT"), "stderr: %s", err);
}

/* llms kb add draws its progress bar on stderr only when stderr is a terminal: nothing
 * of it in a file, the bar (ending at every passage written) on a pty made by script. */
static void kb_add_progress_bar_only_on_a_terminal(void)
{
    NEED_DAEMON();
    char cmd[8192], out[8192], err[4096], file[700];
    proc_fmt(file, sizeof file, "%s/notes.txt", test_tmpdir());
    FILE *f = fopen(file, "w");
    CHECK(f);
    for (int i = 0; i < 4000; i++)
        fprintf(f, "word%d ", i % 211);
    fclose(f);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb create notes", llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb create: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb add notes '%s'", llms_path, llmsd.sock,
             file);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb add: %s", err);
    CHECK_MSG(!strncmp(out, "added 1 documents, ", 19), "stdout: %s", out);
    CHECK_MSG(err[0] == '\0', "a progress bar on stderr that is no terminal: '%s'", err);
    if (system("command -v script >/dev/null 2>&1") != 0)
        SKIP("no script(1) to give llms a terminal");
    /* the same document again (it replaces itself), on a terminal */
    proc_fmt(cmd, sizeof cmd, "script -qec \"'%s' --socket '%s' kb add notes '%s'\" /dev/null"
                              " </dev/null", llms_path, llmsd.sock, file);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb add on a pty: %s%s", out, err);
    CHECK_MSG(strstr(out, "\rkb add: write [") && strstr(out, "100%") &&
                  strstr(out, "1/1 documents written") && strstr(out, "added 1 documents, "),
              "terminal: '%s'", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb drop notes", llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb drop: %s", err);
}

/* Two files of one name in different folders (llms kb add notes a/README.md
 * b/README.md) are two documents of one id: the add is refused naming the id, none of
 * it kept. It had answered "added 2 documents, N passages" while the second replaced
 * the first within the add. */
static void kb_add_refuses_one_id_twice(void)
{
    NEED_DAEMON();
    char cmd[8192], out[8192], err[4096], dir[600], path[2][700];
    proc_fmt(dir, sizeof dir, "%s/twice", test_tmpdir());
    for (int i = 0; i < 2; i++) {
        char sub[650];
        proc_fmt(sub, sizeof sub, "%s/%c", dir, 'a' + i);
        proc_fmt(cmd, sizeof cmd, "mkdir -p '%s'", sub);
        CHECK_EQ(system(cmd), 0);
        proc_fmt(path[i], sizeof path[i], "%s/README.md", sub);
        FILE *f = fopen(path[i], "w");
        CHECK(f);
        fprintf(f, "Document %c: some words about folder %c.\n", 'A' + i, 'a' + i);
        fclose(f);
    }
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb create twice", llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb create: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb add twice '%s' '%s'", llms_path,
             llmsd.sock, path[0], path[1]);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 1, "kb add: %s%s", out, err);
    CHECK_MSG(strstr(err, "INVALID_ARGUMENT") && strstr(err, "'README.md'"), "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb ls", llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb ls: %s", err);
    const char *row = strstr(out, "\ntwice ");
    unsigned docs = 99;
    CHECK_MSG(row && sscanf(row + 7, "%u", &docs) == 1 && docs == 0, "kb ls: %s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' kb drop twice", llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "kb drop: %s", err);
}

/* Empty prompts and texts are the caller's mistake: INVALID_ARGUMENT, and a log line. */
static void empty_input_is_invalid_argument(void)
{
    NEED_DAEMON();
    char cmd[4096], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' ask ''", llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, NULL, 0, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "INVALID_ARGUMENT"), "ask: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' embed x ''", llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, NULL, 0, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "INVALID_ARGUMENT"), "embed: %s", err);
    llms_conn *c = proc_connect(&llmsd, "empty");
    CHECK(c);
    char id[LLMS_ID_MAX];
    CHECK_EQ(llms_context_create(c, NULL, NULL, id), LLMS_OK);
    llms_result r;
    CHECK_EQ(llms_call(c, id, "", NULL, NULL, NULL, &r), LLMS_ERR_INVALID_ARGUMENT);
    llms_close(c);

    FILE *f = fopen(llmsd.log, "r");
    CHECK(f);
    char line[1024];
    int empty_logged = 0, complete_logged = 0;
    while (fgets(line, sizeof line, f)) {
        empty_logged |= strstr(line, "llmsd: info: request app=") &&
                        strstr(line, "kind=call") && strstr(line, "INVALID_ARGUMENT");
        complete_logged |= strstr(line, "kind=complete tokens=") &&
                           strstr(line, " ms=") && strstr(line, "outcome=STOP_");
    }
    fclose(f);
    CHECK_MSG(empty_logged && complete_logged, "no request lines in %s", llmsd.log);
}

/* Why a reply stopped is on stderr; a reply cut by a full context or by the daemon's
 * shutdown ends with status 3. */
static void stop_reasons_through_the_cli(void)
{
    NEED_DAEMON();
    char cmd[4096], out[16384], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --temp 0 --max-tokens 2 ask 'Hi there'",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "ask: %s", err);
    CHECK_MSG(strstr(err, "llms: stop: max_tokens; 2 tokens generated"), "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --temp 0 --max-tokens 2000 ask 'Hi there'",
             llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 3);
    CHECK_MSG(strstr(err, "llms: stop: context_full") && strstr(err, "cut"), "stderr: %s",
              err);

    /* A daemon of its own, stopped with SIGTERM once the reply streams. */
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "cut", slow_model_path, "log_level = error\n") == 0);
    char err_file[700];
    proc_fmt(err_file, sizeof err_file, "%s/cut.err", test_tmpdir());
    proc_fmt(cmd, sizeof cmd,
             "'%s' --socket '%s' --temp 0 --max-tokens 2000 ask 'Tell me a story' 2>'%s'",
             llms_path, d.sock, err_file);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    int first = fgetc(p);
    kill(d.pid, SIGTERM);
    while (fread(out, 1, sizeof out, p) > 0)
        ;
    int status = pclose(p);
    int stopped = proc_stop(&d, 0); /* it is stopping already */
    FILE *f = fopen(err_file, "r");
    size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
    err[n] = '\0';
    if (f)
        fclose(f);
    CHECK(first != EOF);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 3, "exit %d: %s", status, err);
    CHECK_MSG(strstr(err, "llms: stop: shutdown") && strstr(err, "shutting down"), "stderr: %s",
              err);
    CHECK_EQ(stopped, 0);
    /* log_level = error: no request lines. */
    f = fopen(d.log, "r");
    CHECK(f);
    char line[1024];
    int request_lines = 0;
    while (fgets(line, sizeof line, f))
        request_lines += strstr(line, "request app=") != NULL;
    fclose(f);
    CHECK_EQ(request_lines, 0);
}

/* Runs a shell command with stdout on a pipe and sends sig to it once the first byte came;
 * its exit status (-1 when no byte came or it did not exit). cmd should exec the program,
 * so that the signal reaches it and not the shell. */
static int interrupt_after_first_byte(const char *cmd, int sig)
{
    int fds[2];
    if (pipe(fds) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char sink[256];
    ssize_t got = read(fds[0], sink, 1);
    if (got == 1)
        kill(pid, sig);
    while (read(fds[0], sink, sizeof sink) > 0)
        ;
    close(fds[0]);
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return got == 1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Makes knowledge base kb of one document on the daemon at sock, through llms. */
static int rag_kb(const char *sock, const char *kb)
{
    char cmd[4096], file[700];
    proc_fmt(file, sizeof file, "%s/%s.txt", test_tmpdir(), kb);
    FILE *f = fopen(file, "w");
    if (!f)
        return -1;
    for (int i = 0; i < 300; i++)
        fprintf(f, "word%d ", i % 50);
    fclose(f);
    proc_fmt(cmd, sizeof cmd,
             "'%s' --socket '%s' kb create %s && '%s' --socket '%s' kb add %s '%s'", llms_path,
             sock, kb, llms_path, sock, kb, file);
    return run(cmd, NULL, 0, NULL, 0);
}

/* rag ends as ask does: why the answer stopped on stderr, status 3 when the full context
 * cut it (with --json too, which says why in the JSON), 128+N when a signal cancelled it. */
static void rag_exit_status_of_cut_answers(void)
{
    NEED_DAEMON();
    char cmd[8192], out[16384], err[4096];
    CHECK_EQ(rag_kb(llmsd.sock, "ragcut"), 0);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --temp 0 --max-tokens 2000 rag ragcut 'word3?'",
             llms_path, llmsd.sock);
    int rc = run(cmd, out, sizeof out, err, sizeof err);
    CHECK_MSG(rc == 3, "exit %d: %s", rc, err);
    CHECK_MSG(strstr(err, "llms: stop: context_full") && strstr(err, "cut"), "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd,
             "'%s' --socket '%s' --temp 0 --max-tokens 2000 --json rag ragcut 'word3?'",
             llms_path, llmsd.sock);
    rc = run(cmd, out, sizeof out, err, sizeof err);
    CHECK_MSG(rc == 3, "--json: exit %d: %s", rc, err);
    CHECK_MSG(strstr(out, "\"stop_reason\": \"context_full\""), "json: %s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --temp 0 --max-tokens 2 rag ragcut 'word3?'",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, out, sizeof out, err, sizeof err) == 0, "stderr: %s", err);

    /* A daemon of its own whose answers take long enough to interrupt. */
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "ragint", slow_model_path, "log_level = error\n") == 0);
    int made = rag_kb(d.sock, "ragint");
    char err_file[700];
    proc_fmt(err_file, sizeof err_file, "%s/ragint.err", test_tmpdir());
    proc_fmt(cmd, sizeof cmd,
             "exec '%s' --socket '%s' --temp 0 --max-tokens 2000 rag ragint 'word3?' 2>'%s'",
             llms_path, d.sock, err_file);
    rc = made == 0 ? interrupt_after_first_byte(cmd, SIGINT) : -1;
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    FILE *f = fopen(err_file, "r");
    size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
    err[n] = '\0';
    if (f)
        fclose(f);
    CHECK_EQ(made, 0);
    CHECK_MSG(rc == 128 + SIGINT, "exit %d: %s", rc, err);
    CHECK_MSG(strstr(err, "the reply was cancelled"), "stderr: %s", err);
}

/* A turn that fails (longer than the context) is reported and the chat goes on. */
static void chat_goes_on_after_an_error(void)
{
    NEED_DAEMON();
    char cmd[8192], out[8192], err[8192], file[700];
    proc_fmt(file, sizeof file, "%s/turns.txt", test_tmpdir());
    FILE *f = fopen(file, "w");
    CHECK(f);
    fputs("first question\n", f);
    for (int i = 0; i < 800; i++)
        fputs("word ", f);
    fputs("\nlast question\n", f);
    fclose(f);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-goes-on --max-tokens 3 chat < '%s'",
             llms_path, llmsd.sock, file);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "INVALID_ARGUMENT"), "stderr: %s", err);
    char id[LLMS_ID_MAX];
    CHECK_MSG(sscanf(err, "context %127s", id) == 1, "no context id on stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-goes-on ctx show %s", llms_path,
             llmsd.sock, id);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(strstr(out, "first question") && strstr(out, "last question"), "history: %s", out);
}

/* A reranker vocabulary without "yes" / "no" (this model's synthetic one) is a setting
 * to fix: FAILED_PRECONDITION naming the settings, under one "rerank:" prefix. */
static void rerank_without_answer_tokens_names_the_settings(void)
{
    NEED_DAEMON();
    char cmd[4096], err[4096], doc[700];
    proc_fmt(doc, sizeof doc, "%s/doc.txt", test_tmpdir());
    FILE *f = fopen(doc, "w");
    CHECK(f);
    fputs("tok5 tok6\n", f);
    fclose(f);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' rerank -q tok7 '%s'", llms_path, llmsd.sock,
             doc);
    CHECK_EQ(run(cmd, NULL, 0, err, sizeof err), 1);
    CHECK_MSG(strstr(err, "rerank_yes_token") && strstr(err, "(FAILED_PRECONDITION)"),
              "stderr: %s", err);
    const char *first = strstr(err, "rerank:");
    CHECK_MSG(first && !strstr(first + 1, "rerank:"), "stderr: %s", err);
}

/* llms and llmsctl name a context's memory state alike, evicted or resident. */
static void state_names_agree(void)
{
    NEED_DAEMON();
    char cmd[4096], mine[4096], admin[8192], err[4096];
    proc_fmt(cmd, sizeof cmd, "echo hello | '%s' --socket '%s' --app cli-state --max-tokens 2 chat",
             llms_path, llmsd.sock);
    CHECK_MSG(run(cmd, NULL, 0, err, sizeof err) == 0, "chat: %s", err);
    char id[LLMS_ID_MAX];
    CHECK_MSG(sscanf(err, "context %127s", id) == 1, "no context id on stderr: %s", err);
    static const char *const states[] = {"resident", "on_disk", "none"};
    for (int evicted = 0; evicted < 2; evicted++) {
        if (evicted) {
            proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' evict %s", llmsctl_path, llmsd.sock,
                     id);
            CHECK_EQ(run(cmd, NULL, 0, NULL, 0), 0);
        }
        proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --app cli-state ctx list", llms_path,
                 llmsd.sock);
        CHECK_EQ(run(cmd, mine, sizeof mine, NULL, 0), 0);
        proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' contexts | grep %s", llmsctl_path,
                 llmsd.sock, id);
        CHECK_EQ(run(cmd, admin, sizeof admin, NULL, 0), 0);
        int same = 0;
        for (int i = 0; i < 3; i++) {
            char word[32];
            proc_fmt(word, sizeof word, " %s ", states[i]);
            same += strstr(mine, word) && strstr(admin, word);
        }
        CHECK_MSG(same == 1, "llms: %sllmsctl: %s", mine, admin);
        CHECK_MSG(evicted == !strstr(mine, " resident "), "llms: %s", mine);
    }
}

/* Admin calls need no app: llmsctl does not count itself among the apps. */
static void llmsctl_is_not_an_app(void)
{
    NEED_DAEMON();
    char cmd[4096], out[8192];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' status", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --json apps", llmsctl_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, NULL, 0), 0);
    CHECK_MSG(!strncmp(out, "{\"apps\":[", 9) && !strstr(out, "llmsctl"), "apps: %s", out);
}

/* With stdout or stderr closed, what llms would print there is lost, but the call works:
 * the connection's socket does not take the closed fd, so no text reaches the daemon. A
 * reply that could not be written (stdout closed, a full disk) ends in status 1. */
static void closed_stdout_or_stderr(void)
{
    NEED_DAEMON();
    char cmd[4096], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 3 ask hi >&-", llms_path,
             llmsd.sock);
    int rc = run(cmd, NULL, 0, err, sizeof err);
    /* the reply is generated whole; that it could not be written is the status */
    CHECK_MSG(rc == 1, "ask with stdout closed: exit %d: %s", rc, err);
    CHECK_MSG(strstr(err, "llms: stop: max_tokens"), "stderr: %s", err);
    CHECK_MSG(strstr(err, "llms: writing the output failed"), "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 3 ask hi > /dev/full", llms_path,
             llmsd.sock);
    rc = run(cmd, NULL, 0, err, sizeof err);
    CHECK_MSG(rc == 1, "ask into a full disk: exit %d: %s", rc, err);
    CHECK_MSG(strstr(err, "llms: writing the output failed"), "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd,
             "printf 'one\\ntwo\\n' | '%s' --socket '%s' --app cli-closed --max-tokens 3 chat "
             "2>&-", llms_path, llmsd.sock);
    char out[4096];
    rc = run(cmd, out, sizeof out, NULL, 0);
    CHECK_MSG(rc == 0, "chat with stderr closed: exit %d", rc);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    CHECK_MSG(lines == 2, "two replies expected, got: '%s'", out);
}

/* A signal while chat waits for the next line ends it with status 128+N, as one during a
 * reply does (SIGINT there only cuts the reply). */
static void chat_waiting_for_a_line_ends_on_sigterm(void)
{
    NEED_DAEMON();
    int in[2], err[2];
    CHECK(pipe(in) == 0 && pipe(err) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(in[0], STDIN_FILENO);
        dup2(err[1], STDERR_FILENO);
        close(in[0]);
        close(in[1]);
        close(err[0]);
        close(err[1]);
        execl(llms_path, "llms", "--socket", llmsd.sock, "--app", "cli-idle", "chat",
              (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(err[1]);
    /* the context line: chat has its context and waits on stdin */
    char text[512];
    ssize_t got = read(err[0], text, sizeof text - 1);
    text[got > 0 ? got : 0] = '\0';
    usleep(100000);
    kill(pid, SIGTERM);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    close(in[1]);
    close(err[0]);
    CHECK_MSG(strstr(text, "context "), "stderr: %s", text);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "status %#x", status);
}

/* Until a call that streams runs, SIGTERM ends llms as it ends any program: a daemon that
 * never answers (here a socket nobody accepts on) must not leave llms deaf to signals, in
 * its bind, a listing or a rag --json that has no piece to cancel at. */
static void signals_end_calls_that_do_not_stream(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    char sock[700];
    proc_fmt(sock, sizeof sock, "%s/wedged.sock", test_tmpdir());
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    CHECK(strlen(sock) < sizeof addr.sun_path);
    memcpy(addr.sun_path, sock, strlen(sock) + 1);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(lfd >= 0);
    CHECK(bind(lfd, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(lfd, 8) == 0);
    static const char *const cases[][4] = {
        {"kb", "ls", NULL}, {"ask", "hi", NULL}, {"--json", "rag", "k", "q"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            execl(llms_path, "llms", "--socket", sock, cases[i][0], cases[i][1], cases[i][2],
                  cases[i][3], (char *)NULL);
            _exit(127);
        }
        usleep(300000);
        kill(pid, SIGTERM);
        int status = 0;
        pid_t done = 0;
        for (int t = 0; t < 100 && (done = waitpid(pid, &status, WNOHANG)) == 0; t++)
            usleep(50000);
        if (done == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
        CHECK_MSG(done == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM,
                  "llms %s %s: still running 5 s after SIGTERM", cases[i][0], cases[i][1]);
    }
    close(lfd);
}

static void bad_usage_fails(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    char cmd[4096], out[1024], err[1024];
    proc_fmt(cmd, sizeof cmd, "'%s' frobnicate", llms_path);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 2);
    CHECK_MSG(strstr(err, "unknown command 'frobnicate'") != NULL, "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --temp abc ask hi", llms_path);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 2);
    proc_fmt(cmd, sizeof cmd, "'%s' show", llmsctl_path);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 2);
}

/* "--" ends the options, as getopt's does: a prompt that starts with '-' is a prompt
 * after it, an unknown option before it. */
static void double_dash_ends_options(void)
{
    NEED_DAEMON();
    char cmd[4096], out[4096], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 2 ask -- '-1 is a number'",
             llms_path, llmsd.sock);
    int rc = run(cmd, out, sizeof out, err, sizeof err);
    CHECK_MSG(rc == 0, "ask -- '-1 is a number': exit %d: %s", rc, err);
    CHECK_MSG(strstr(err, "llms: stop: max_tokens"), "stderr: %s", err);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' --max-tokens 2 ask '-1 is a number'",
             llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 2);
}

/* graph ls lists the built-in templates, their cap "-" (they are acyclic: no cap of
 * their own, each node runs once), where it printed 0 as if they could run no step. */
static void graph_ls_lists_the_builtins(void)
{
    NEED_DAEMON();
    char cmd[4096], out[8192], err[4096];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' graph ls", llms_path, llmsd.sock);
    CHECK_EQ(run(cmd, out, sizeof out, err, sizeof err), 0);
    CHECK_MSG(strstr(out, "MAX_STEPS"), "%s", out);
    const char *line = strstr(out, "\nhyde ");
    CHECK_MSG(line, "%s", out);
    char name[32], kind[16], steps[16];
    int nodes, edges;
    CHECK_EQ(sscanf(line, " %31s %15s %d %d %15s", name, kind, &nodes, &edges, steps), 5);
    CHECK_MSG(!strcmp(kind, "built-in") && !strcmp(steps, "-"), "%.80s", line);
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (llmsd_path[0]) {
        /* The clients sit beside llmsd: replace its name at the end of the path. */
        int dir_len = (int)strlen(llmsd_path) - (int)strlen("llmsd");
        proc_fmt(llms_path, sizeof llms_path, "%.*sllms", dir_len, llmsd_path);
        proc_fmt(llmsctl_path, sizeof llmsctl_path, "%.*sllmsctl", dir_len, llmsd_path);
    }
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 5, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "cli.gguf", &mp);
    modelgen_params slow = mp;
    slow.dim = 256;
    slow.n_layer = 4;
    slow.n_head = 8;
    slow.n_head_kv = 4;
    slow.n_ff = 768;
    slow.type = QTYPE_Q8_0;
    proc_generate_model(slow_model_path, sizeof slow_model_path, "slow.gguf", &slow);
    RUN(help_and_version);
    RUN(bad_values_name_the_option);
    RUN(ask_prints_an_answer);
    RUN(serves_phi3_and_granite);
    RUN(ask_format_json_reaches_the_daemon);
    RUN(ask_grammar_reaches_the_daemon);
    RUN(ask_reads_stdin_and_files);
    RUN(empty_input_is_invalid_argument);
    RUN(stop_reasons_through_the_cli);
    RUN(chat_goes_on_after_an_error);
    RUN(chat_waiting_for_a_line_ends_on_sigterm);
    RUN(rag_exit_status_of_cut_answers);
    RUN(llmsctl_is_not_an_app);
    RUN(state_names_agree);
    RUN(rerank_without_answer_tokens_names_the_settings);
    RUN(chat_resumes_and_ctx_commands);
    RUN(json_of_invalid_utf8_history_is_valid);
    RUN(kb_add_progress_bar_only_on_a_terminal);
    RUN(kb_add_refuses_one_id_twice);
    RUN(closed_stdout_or_stderr);
    RUN(double_dash_ends_options);
    RUN(graph_ls_lists_the_builtins);
    RUN(llmsctl_reports);
    RUN(streamed_text_is_valid_utf8);
    RUN(bad_usage_fails);
    RUN(signals_end_calls_that_do_not_stream);
    if (llmsd_up == 1)
        proc_stop(&llmsd, SIGTERM);
    return test_finish();
}
