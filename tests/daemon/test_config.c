/*
 * Tests of llmsd's settings: defaults, the file format, values, errors that name the key,
 * the file and the line, and the documentation generated from the settings table.
 */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "tests/support/test.h"

static const char *write_file(const char *name, const char *text)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (!f)
        return NULL;
    fputs(text, f);
    fclose(f);
    return path;
}

static void defaults(void)
{
    config c;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK(strcmp(c.socket, "/run/llmsd/llmsd.sock") == 0);
    CHECK(strcmp(c.state_dir, "/var/lib/llmsd") == 0);
    CHECK(strcmp(c.admin_group, "llms-admin") == 0);
    CHECK_EQ(c.socket_mode, 0660);
    CHECK_EQ(c.threads, 0);
    CHECK_EQ(c.n_ctx, 0);
    CHECK_EQ(c.max_frame_bytes, 16u << 20);
    CHECK_NEAR(c.temperature, 0.8, 1e-6);
    CHECK_EQ(c.model[0], '\0');
    CHECK_EQ(config_check(&c, err), -1);
    CHECK(strstr(err, "model") != NULL);
}

static void file_with_comments(void)
{
    const char *path = write_file("ok.conf",
                                  "# llmsd settings\n"
                                  "\n"
                                  "model = /models/x.gguf   # the weights\n"
                                  "  socket=/tmp/s.sock\n"
                                  "threads = 4\n"
                                  "socket_mode = 0600\n"
                                  "temperature = 0\n"
                                  "top_p = 0.5\n"
                                  "repeat_last_n = -1\n"
                                  "max_frame_bytes = 4294967295\n");
    CHECK(path);
    config c;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK_MSG(config_load(&c, path, err) == 0, "%s", err);
    CHECK(strcmp(c.model, "/models/x.gguf") == 0);
    CHECK(strcmp(c.socket, "/tmp/s.sock") == 0);
    CHECK_EQ(c.threads, 4);
    CHECK_EQ(c.socket_mode, 0600);
    CHECK_NEAR(c.temperature, 0, 0);
    CHECK_NEAR(c.top_p, 0.5, 1e-6);
    CHECK_EQ(c.repeat_last_n, -1);
    CHECK_EQ(c.max_frame_bytes, 4294967295u);
    CHECK_EQ(c.max_tokens, 256); /* untouched keys keep their defaults */
    CHECK_EQ(config_check(&c, err), 0);
}

/* Loads text and expects an error mentioning every one of the words. */
static int load_fails_with(const char *text, const char *w1, const char *w2)
{
    const char *path = write_file("bad.conf", text);
    config c;
    char err[ERR_MAX] = "";
    if (!path || config_defaults(&c, err) || config_load(&c, path, err) != -1)
        return 0;
    if (!strstr(err, "bad.conf") || (w1 && !strstr(err, w1)) || (w2 && !strstr(err, w2))) {
        fprintf(stderr, "unexpected message: %s\n", err);
        return 0;
    }
    return 1;
}

static void file_errors_name_key_file_and_line(void)
{
    CHECK(load_fails_with("threads = 2\nfrobnicate = 1\n", "frobnicate", ":2:"));
    CHECK(load_fails_with("threads = two\n", "threads", ":1:"));
    CHECK(load_fails_with("\n\nthreads = -1\n", "threads", ":3:"));
    CHECK(load_fails_with("top_p = 1.5\n", "top_p", ":1:"));
    CHECK(load_fails_with("temperature = nan\n", "temperature", NULL));
    CHECK(load_fails_with("socket_mode = 0999\n", "socket_mode", NULL));
    CHECK(load_fails_with("socket_mode = 01777\n", "socket_mode", NULL));
    CHECK(load_fails_with("just words\n", ":1:", "key = value"));
    CHECK(load_fails_with("model =\n", "model", "empty"));
    CHECK(load_fails_with("max_frame_bytes = 4294967296\n", "max_frame_bytes", NULL));
    CHECK(load_fails_with("max_tokens = 10x\n", "max_tokens", NULL));
}

static void missing_file(void)
{
    config c;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    char path[1024];
    snprintf(path, sizeof path, "%s/absent.conf", test_tmpdir());
    CHECK_EQ(config_load(&c, path, err), -1);
    CHECK(strstr(err, "absent.conf") != NULL);
}

static void set_single_keys(void)
{
    config c;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK_EQ(config_set(&c, "kv_budget_mb", "0", err), 0);
    CHECK_EQ(c.kv_budget_mb, 0);
    CHECK_EQ(config_set(&c, "admin_group", "wheel", err), 0);
    CHECK(strcmp(c.admin_group, "wheel") == 0);
    CHECK_EQ(config_set(&c, "nope", "1", err), -1);
    CHECK(strstr(err, "nope") != NULL);
    CHECK(config_known("max_queued_per_app"));
    CHECK(!config_known("max_queued"));
    char longpath[200];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    CHECK_EQ(config_set(&c, "socket", longpath, err), -1);
    CHECK(strstr(err, "socket") != NULL);
    CHECK(strcmp(c.log_level, "info") == 0);
    CHECK_EQ(config_set(&c, "log_level", "error", err), 0);
    CHECK(strcmp(c.log_level, "error") == 0);
    CHECK_EQ(config_set(&c, "log_level", "debug", err), -1);
    CHECK(strstr(err, "log_level") && strstr(err, "error|warn|info"));
}

static void semantic_keys(void)
{
    config c;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK_EQ(c.rerank_stream_weights, 1);
    CHECK_EQ(c.rerank_yes_token, -1);
    CHECK_EQ(c.rerank_model[0], '\0');
    CHECK_EQ(config_set(&c, "rerank_model", "/m/rr.gguf", err), 0);
    CHECK(strcmp(c.rerank_model, "/m/rr.gguf") == 0);
    CHECK_EQ(config_set(&c, "rerank_stream_weights", "0", err), 0);
    CHECK_EQ(c.rerank_stream_weights, 0);
    CHECK(config_set(&c, "rerank_stream_weights", "2", err) < 0);
    CHECK_EQ(config_set(&c, "rerank_no_token", "17", err), 0);
    CHECK_EQ(c.rerank_no_token, 17);
    CHECK(config_set(&c, "rerank_yes_token", "-2", err) < 0);
    CHECK(config_set(&c, "embed_max_texts", "0", err) < 0);
    CHECK(strstr(err, "embed_max_texts") != NULL);
}

/* model.NAME lines: path and roles, a replaced name, and what is refused. */
static void model_lines(void)
{
    config c;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK(config_known("model.bge-small") && !config_known("model.") &&
          !config_known("model.a/b"));
    CHECK_EQ(config_set(&c, "model.bge", "/m/bge.gguf", err), 0);
    CHECK_EQ(config_set(&c, "model.rr", "/m/my models/rr.gguf  rerank,embed", err), 0);
    CHECK_EQ(c.n_models, 2);
    CHECK(strcmp(c.models[0].path, "/m/bge.gguf") == 0 && c.models[0].roles[0] == '\0');
    CHECK(strcmp(c.models[1].path, "/m/my models/rr.gguf") == 0);
    CHECK(strcmp(c.models[1].roles, "rerank,embed") == 0);
    CHECK_EQ(config_set(&c, "model.bge", "/m/bge2.gguf embed", err), 0);
    CHECK_EQ(c.n_models, 2);
    CHECK(strcmp(c.models[0].path, "/m/bge2.gguf") == 0);
    CHECK(config_set(&c, "model.x", "/m/x.gguf fly", err) < 0);
    CHECK_MSG(strstr(err, "model.x") && strstr(err, "generate, embed, rerank or draft"), "%s", err);
    CHECK_EQ(config_set(&c, "model.small", "/m/small.gguf draft", err), 0);
    CHECK_EQ(c.n_models, 3);
    CHECK(config_set(&c, "model.x", "/m/my models/x.gguf", err) < 0);
    CHECK(config_set(&c, "model.a b", "/m/x.gguf", err) < 0);
    char key[128];
    snprintf(key, sizeof key, "model.%060d", 0);
    CHECK(config_set(&c, key, "/m/x.gguf", err) < 0);
    CHECK(config_set(&c, "model.x", "   ", err) < 0);
    for (int i = c.n_models; i < CONFIG_MODELS_MAX; i++) {
        snprintf(key, sizeof key, "model.m%d", i);
        CHECK_EQ(config_set(&c, key, "/m/x.gguf", err), 0);
    }
    CHECK(config_set(&c, "model.one-more", "/m/x.gguf", err) < 0);
    /* model.NAME lines alone satisfy the check (models_open finds the generate one) */
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK(config_check(&c, err) < 0);
    CHECK_EQ(config_set(&c, "model.chat", "/m/q.gguf generate", err), 0);
    CHECK_EQ(config_check(&c, err), 0);
}

/* lora.NAME lines: a base model's name and adapter files with their scales; what is
 * refused. */
static void lora_lines(void)
{
    config c;
    char err[ERR_MAX], path[CONFIG_PATH_MAX];
    float scale;
    CHECK_MSG(config_defaults(&c, err) == 0, "%s", err);
    CHECK(config_known("lora.sql-tuned") && !config_known("lora.") && !config_known("lora.a/b"));
    CHECK_EQ(config_set(&c, "lora.sql", "docs /m/sql.gguf", err), 0);
    CHECK_EQ(config_set(&c, "lora.mix", " docs  /m/a.gguf:0.5\t/m/b:c.gguf:-1e-1 /m/c:d.gguf ", err),
             0);
    CHECK_EQ(c.n_loras, 2);
    CHECK(strcmp(c.loras[0].name, "sql") == 0 && strcmp(c.loras[0].base, "docs") == 0);
    const char *p = c.loras[1].adapters;
    CHECK_EQ(config_lora_next(&p, path, &scale, err), 1);
    CHECK(strcmp(path, "/m/a.gguf") == 0 && scale == 0.5f);
    CHECK_EQ(config_lora_next(&p, path, &scale, err), 1);
    CHECK(strcmp(path, "/m/b:c.gguf") == 0 && scale == -0.1f);
    CHECK_EQ(config_lora_next(&p, path, &scale, err), 1);
    CHECK(strcmp(path, "/m/c:d.gguf") == 0 && scale == 1.0f);
    CHECK_EQ(config_lora_next(&p, path, &scale, err), 0);
    /* a name given again replaces its line */
    CHECK_EQ(config_set(&c, "lora.sql", "docs /m/sql2.gguf:2", err), 0);
    CHECK_EQ(c.n_loras, 2);
    CHECK(strcmp(c.loras[0].adapters, "/m/sql2.gguf:2") == 0);
    /* refused: no adapter, a bad base name, a scale that is no number, too many */
    CHECK(config_set(&c, "lora.x", "docs", err) < 0);
    CHECK_MSG(strstr(err, "lora.x") && strstr(err, "no adapter"), "%s", err);
    CHECK(config_set(&c, "lora.x", "do/cs /m/a.gguf", err) < 0);
    CHECK_MSG(strstr(err, "base model name"), "%s", err);
    CHECK(config_set(&c, "lora.x", "docs /m/a.gguf:inf", err) < 0);
    CHECK_MSG(strstr(err, "scale 'inf' is not a finite number"), "%s", err);
    CHECK(config_set(&c, "lora.x", "docs a b c d e f g h i", err) < 0);
    CHECK_MSG(strstr(err, "at most 8 adapters"), "%s", err);
    CHECK(config_set(&c, "lora.a b", "docs /m/a.gguf", err) < 0);
    char key[128];
    for (int i = c.n_loras; i < CONFIG_LORAS_MAX; i++) {
        snprintf(key, sizeof key, "lora.l%d", i);
        CHECK_EQ(config_set(&c, key, "docs /m/x.gguf", err), 0);
    }
    CHECK(config_set(&c, "lora.one-more", "docs /m/x.gguf", err) < 0);
}

/* The repository's root (where daemon/config.c is): the working directory (tests/run.sh
 * runs there), else found above the test program (build/tests/daemon or
 * build/asan/tests/daemon). "" when neither has it. */
static char root[PATH_MAX];

static void find_root(const char *argv0)
{
    char self[PATH_MAX], probe[PATH_MAX + 32];
    if (getcwd(root, sizeof root)) {
        snprintf(probe, sizeof probe, "%s/daemon/config.c", root);
        if (access(probe, R_OK) == 0)
            return;
    }
    snprintf(self, sizeof self, "%s", argv0);
    char *dir = realpath(dirname(self), NULL);
    for (int up = 3; dir && up <= 4; up++) {
        snprintf(probe, sizeof probe, "%s%s/daemon/config.c", dir,
                 up == 3 ? "/../../.." : "/../../../..");
        if (access(probe, R_OK) == 0) {
            snprintf(root, sizeof root, "%s%s", dir, up == 3 ? "/../../.." : "/../../../..");
            free(dir);
            return;
        }
    }
    free(dir);
    root[0] = '\0';
}

/* The whole of a file, NUL-terminated (free it), or NULL. */
static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    char buf[8192];
    size_t n;
    while (mem && (n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, mem);
    if (mem)
        fclose(mem);
    fclose(f);
    return text;
}

/* The documentation in format, NUL-terminated (free it), or NULL. */
static char *generate(config_doc format)
{
    char *text = NULL, err[ERR_MAX];
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        return NULL;
    int rc = config_print_settings(mem, format, err);
    fclose(mem);
    if (rc) {
        free(text);
        return NULL;
    }
    return text;
}

/* Line number (have's first is line) and text of the first line where have and want
 * differ. */
static void first_difference(const char *have, const char *want, int line, char *out,
                             size_t cap)
{
    const char *h = have, *w = want;
    while (*h && *h == *w) {
        if (*h == '\n') {
            line++;
            have = h + 1;
            want = w + 1;
        }
        h++;
        w++;
    }
    snprintf(out, cap, "line %d: has '%.*s', the table makes '%.*s'", line,
             (int)strcspn(have, "\n"), have, (int)strcspn(want, "\n"), want);
}

/* Checks that the file at root/relative holds what the table makes in format: the whole
 * file (the sample), or from the generated text's first line (a marker) on. Skips when
 * the file is absent. */
static void check_generated(const char *relative, config_doc format)
{
    if (!root[0])
        SKIP("no source tree (daemon/config.c) here or above the test program");
    char path[PATH_MAX + 64], why[512] = "";
    snprintf(path, sizeof path, "%s/%s", root, relative);
    char *file = read_all(path);
    if (!file)
        SKIP("%s is not in %s", relative, root);
    char *made = generate(format);
    const char *have = format == CONFIG_DOC_MARKDOWN ? strstr(file, CONFIG_DOC_BEGIN) : file;
    int ok = 0;
    if (!made)
        snprintf(why, sizeof why, "config_print_settings failed");
    else if (!have)
        snprintf(why, sizeof why, "no line '%s'", CONFIG_DOC_BEGIN);
    else if (format == CONFIG_DOC_MARKDOWN)
        ok = strncmp(have, made, strlen(made)) == 0;
    else
        ok = strcmp(have, made) == 0;
    if (made && have && !ok) {
        int line = 1;
        for (const char *p = file; p < have; p++)
            line += *p == '\n';
        first_difference(have, made, line, why, sizeof why);
    }
    free(file);
    free(made);
    CHECK_MSG(ok, "%s is stale (%s): run `make settings-docs` to regenerate it from the table "
                  "in daemon/config.c",
              relative, why);
}

static void readme_table_is_current(void)
{
    check_generated("daemon/README.md", CONFIG_DOC_MARKDOWN);
}

static void sample_conf_is_current(void)
{
    check_generated("systemd/llmsd.conf", CONFIG_DOC_CONF);
}

/* The sample llmsd.conf sets every key to its default, the model aside: an admin who
 * installs it and sets `model` gets the defaults of every other key (a sample
 * rerank_model naming a file beside the model stopped the daemon at start). */
static void sample_conf_sets_the_defaults(void)
{
    char *sample = generate(CONFIG_DOC_CONF);
    CHECK(sample);
    const char *path = write_file("sample.conf", sample);
    free(sample);
    CHECK(path);
    config want, have;
    char err[ERR_MAX];
    CHECK_MSG(config_defaults(&want, err) == 0, "%s", err);
    CHECK_MSG(config_defaults(&have, err) == 0, "%s", err);
    CHECK_MSG(config_load(&have, path, err) == 0, "%s", err);
    CHECK_EQ(config_check(&have, err), 0);
    CHECK(have.model[0] && have.n_models == 0);
    memcpy(want.model, have.model, sizeof want.model);
    CHECK(memcmp(&want, &have, sizeof want) == 0);
}

/* --help shows each key with its default, model.NAME and lora.NAME after model, and the
 * groups. */
static void help_lists_keys_with_defaults(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    CHECK(mem);
    config_print_keys(mem);
    fclose(mem);
    int ok = strstr(text, "  --kv_budget_mb") && strstr(text, "(default 1024)\n") &&
             strstr(text, "(default 0660)\n") && strstr(text, "\nConnections:\n") &&
             strstr(text, "  --model.NAME") &&
             strstr(text, "  --model ") < strstr(text, "  --model.NAME") &&
             strstr(text, "  --model.NAME") < strstr(text, "  --lora.NAME") && !strchr(text, '`');
    free(text);
    CHECK(ok);
}

int main(int argc, char **argv)
{
    (void)argc;
    find_root(argv[0]);
    RUN(defaults);
    RUN(file_with_comments);
    RUN(file_errors_name_key_file_and_line);
    RUN(missing_file);
    RUN(set_single_keys);
    RUN(semantic_keys);
    RUN(model_lines);
    RUN(lora_lines);
    RUN(readme_table_is_current);
    RUN(sample_conf_is_current);
    RUN(sample_conf_sets_the_defaults);
    RUN(help_lists_keys_with_defaults);
    return test_finish();
}
