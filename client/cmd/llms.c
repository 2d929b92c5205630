/*
 * llms — the user's command line client of llmsd.
 *
 *   llms [options] ask "PROMPT"                one-shot answer (nothing is kept)
 *   llms [options] chat [--context ID] [--system TEXT]
 *                                              conversation; lines from stdin
 *   llms [options] ctx list | show ID | rm ID  the app's contexts
 *   llms [options] embed TEXT...               one vector per text
 *   llms [options] rerank -q QUERY [-k K] FILE...
 *                                              top-K of the files (each a document)
 *
 * options: --socket PATH, --app NAME (default llms-cli), --temp T, --max-tokens N,
 *          --seed S, --json (embed, rerank), --pooling last|mean (embed),
 *          --mode set|ordered, --threshold T, --precision P (rerank)
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/utf8.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: llms [options] ask \"PROMPT\"\n"
            "       llms [options] chat [--context ID] [--system TEXT]\n"
            "       llms [options] ctx list | show ID | rm ID\n"
            "       llms [options] embed TEXT...\n"
            "       llms [options] rerank -q QUERY [-k K] FILE...\n"
            "options: --socket PATH  daemon socket (default $LLMS_SOCKET or %s)\n"
            "         --app NAME     app name the contexts belong to (default llms-cli)\n"
            "         --temp T       sampling temperature (0: greedy)\n"
            "         --max-tokens N tokens to generate at most\n"
            "         --seed S       sampling seed\n"
            "         --json         embed, rerank: JSON output\n"
            "         --pooling last|mean      embed: token pooling (default last)\n"
            "         -q, --query TEXT         rerank: the query\n"
            "         -k, --top-k K            rerank: documents to select (default 5)\n"
            "         --mode set|ordered       rerank: exact membership or exact order\n"
            "         --threshold T            rerank: pruning threshold (0: none)\n"
            "         --precision P            rerank: use the threshold calibrated for P\n",
            LLMS_DEFAULT_SOCKET);
    exit(2);
}

/* Streams each piece of a reply as it arrives; Ctrl-C cancels the call. */
static int print_text(const char *text, size_t len, void *user)
{
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return interrupted;
}

static int report(llms_conn *c, enum llms_status s, const char *what)
{
    if (s == LLMS_OK)
        return 0;
    fprintf(stderr, "llms: %s: %s (%s)\n", what, llms_last_error(c), llms_status_name(s));
    return 1;
}

static const char *memory_name(enum llms_memory m)
{
    switch (m) {
    case LLMS_MEMORY_RESIDENT:
        return "resident";
    case LLMS_MEMORY_ON_DISK:
        return "on-disk";
    default:
        return "none";
    }
}

static void format_time(uint64_t unix_ms, char *buf, size_t cap)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
}

static int cmd_ask(llms_conn *c, const llms_params *p, const char *prompt)
{
    llms_result r;
    enum llms_status s = llms_complete(c, prompt, NULL, 1, p, print_text, NULL, &r);
    printf("\n");
    llms_result_free(&r);
    if (s == LLMS_ERR_CANCELLED)
        return 130;
    return report(c, s, "ask");
}

static int cmd_chat(llms_conn *c, const llms_params *p, const char *context, const char *system)
{
    char id[LLMS_ID_MAX];
    enum llms_status s;
    if (context) {
        llms_context_info info;
        if ((s = llms_context_get(c, context, 0, &info)) != LLMS_OK)
            return report(c, s, context);
        llms_context_info_free(&info);
        snprintf(id, sizeof id, "%s", context);
    } else {
        if ((s = llms_context_create(c, system, NULL, id)) != LLMS_OK)
            return report(c, s, "creating a context");
        fprintf(stderr, "context %s (resume with: llms chat --context %s)\n", id, id);
    }

    int tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (tty) {
            fprintf(stderr, "> ");
            fflush(stderr);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0)
            break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0)
            continue;
        interrupted = 0;
        s = llms_call(c, id, line, p, print_text, NULL, NULL);
        printf("\n");
        fflush(stdout);
        if (s == LLMS_ERR_CANCELLED)
            continue;
        if ((rc = report(c, s, "chat")) != 0)
            break;
    }
    free(line);
    return rc;
}

/* argv is one of: list | show ID | rm ID (checked by main). */
static int cmd_ctx(llms_conn *c, int argc, char **argv)
{
    (void)argc;
    enum llms_status s;
    if (!strcmp(argv[0], "list")) {
        llms_context_info *infos;
        size_t n;
        if ((s = llms_context_list(c, &infos, &n)) != LLMS_OK)
            return report(c, s, "listing contexts");
        for (size_t i = 0; i < n; i++) {
            char used[64];
            format_time(infos[i].last_used_unix_ms, used, sizeof used);
            printf("%s  %6" PRIu32 " tokens  %-8s  last used %s\n", infos[i].id,
                   infos[i].n_tokens, memory_name(infos[i].memory), used);
        }
        llms_context_list_free(infos, n);
        return 0;
    }
    if (!strcmp(argv[0], "show")) {
        llms_context_info info;
        if ((s = llms_context_get(c, argv[1], 1, &info)) != LLMS_OK)
            return report(c, s, argv[1]);
        char created[64], used[64];
        format_time(info.created_unix_ms, created, sizeof created);
        format_time(info.last_used_unix_ms, used, sizeof used);
        printf("context   %s\ntokens    %" PRIu32 "\nmemory    %s\ncreated   %s\n"
               "last used %s\n",
               info.id, info.n_tokens, memory_name(info.memory), created, used);
        for (size_t i = 0; i < info.n_history; i++)
            printf("\n[%s]\n%s\n", info.history[i].role, info.history[i].content);
        llms_context_info_free(&info);
        return 0;
    }
    return report(c, llms_context_delete(c, argv[1]), argv[1]);
}

static int cmd_embed(llms_conn *c, char **texts, int n, enum llms_pooling pooling, int json)
{
    llms_embeddings e;
    enum llms_status s = llms_embed(c, (const char *const *)texts, (size_t)n, pooling, &e);
    if (s != LLMS_OK)
        return report(c, s, "embed");
    if (json)
        printf("{\"dim\": %" PRIu32 ", \"vectors\": [", e.dim);
    for (size_t i = 0; i < e.n; i++) {
        const float *v = e.values + i * e.dim;
        if (json)
            printf("%s{\"n_tokens\": %" PRIu32 ", \"values\": [", i ? ", " : "", e.n_tokens[i]);
        for (uint32_t d = 0; d < e.dim; d++)
            printf(json ? "%s%.9g" : "%s%.6g", d ? (json ? ", " : " ") : "", v[d]);
        printf(json ? "]}" : "\n");
    }
    if (json)
        printf("]}\n");
    llms_embeddings_free(&e);
    return 0;
}

/* The whole file at path (NUL-terminated), or NULL with a message. */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llms: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(f)) {
        fprintf(stderr, "llms: %s: read error\n", path);
        free(buf);
        buf = NULL;
    } else if (!buf) {
        fprintf(stderr, "llms: %s: out of memory\n", path);
    } else {
        buf[len] = '\0';
    }
    fclose(f);
    return buf;
}

static int cmd_rerank(llms_conn *c, const char *query, char **files, int n,
                      const llms_rerank_options *o, int json)
{
    char **docs = calloc((size_t)n + 1, sizeof *docs);
    int rc = docs ? 0 : 1;
    for (int i = 0; i < n && rc == 0; i++)
        if (!(docs[i] = read_file(files[i])))
            rc = 1;
    llms_rerank_result r;
    if (rc == 0) {
        enum llms_status s = llms_rerank(c, query, (const char *const *)docs, (size_t)n, o, &r);
        rc = report(c, s, "rerank");
    }
    if (rc == 0) {
        size_t layers = 0;
        for (size_t i = 0; i < r.n_documents; i++)
            layers += r.layers_computed[i];
        double mean_layers = r.n_documents ? (double)layers / r.n_documents : 0;
        if (json) {
            printf("{\"hits\": [");
            for (size_t i = 0; i < r.n_hits; i++) {
                printf("%s{\"rank\": %zu, \"index\": %" PRIu32 ", \"score\": %.6g, \"file\": ",
                       i ? ", " : "", i + 1, r.hits[i].index, r.hits[i].score);
                utf8_json_string(stdout, files[r.hits[i].index]);
                printf("}");
            }
            printf("], \"layers_computed\": [");
            for (size_t i = 0; i < r.n_documents; i++)
                printf("%s%" PRIu32, i ? ", " : "", r.layers_computed[i]);
            printf("], \"pruned_at_layer\": [");
            for (size_t l = 0; l < r.n_layer; l++)
                printf("%s%" PRIu32, l ? ", " : "", r.pruned_at_layer[l]);
            printf("], \"peak_bytes\": %" PRIu64 ", \"time_ms\": %.3f, \"cv_threshold\": %.6g}\n",
                   r.peak_bytes, r.time_ms, r.cv_threshold);
        } else {
            printf("rank  index     score  file\n");
            for (size_t i = 0; i < r.n_hits; i++)
                printf("%4zu  %5" PRIu32 "  %.6f  %s\n", i + 1, r.hits[i].index, r.hits[i].score,
                       files[r.hits[i].index]);
            printf("layers computed: %.2f of %zu per document; pruned per layer:", mean_layers,
                   r.n_layer);
            for (size_t l = 0; l < r.n_layer; l++)
                printf(" %" PRIu32, r.pruned_at_layer[l]);
            printf("\npeak %" PRIu64 " bytes, %.1f ms, threshold %g\n", r.peak_bytes, r.time_ms,
                   r.cv_threshold);
        }
        llms_rerank_result_free(&r);
    }
    for (int i = 0; i < n; i++)
        free(docs ? docs[i] : NULL);
    free(docs);
    return rc;
}

/* Parses a number option's value or exits with usage. */
static double number(const char *opt, const char *v)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end) {
        fprintf(stderr, "llms: %s: not a number: %s\n", opt, v);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    const char *socket_path = NULL, *app = "llms-cli", *context = NULL, *system = NULL;
    const char *query = NULL;
    int json = 0;
    enum llms_pooling pooling = LLMS_POOLING_LAST;
    llms_rerank_options ro;
    llms_rerank_options_init(&ro);
    llms_params p;
    llms_params_init(&p);
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    int npos = 0;
    if (!pos)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            usage();
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 && strcmp(a, "-q") != 0 && strcmp(a, "-k") != 0) {
            pos[npos++] = argv[i];
            continue;
        }
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "-q") || !strcmp(a, "--query"))
            query = v;
        else if (!strcmp(a, "-k") || !strcmp(a, "--top-k")) {
            double k = number(a, v);
            if (k < 1 || k > UINT32_MAX || k != floor(k)) {
                fprintf(stderr, "llms: %s: not a positive integer: %s\n", a, v);
                exit(2);
            }
            ro.top_k = (uint32_t)k;
        } else if (!strcmp(a, "--pooling") && (!strcmp(v, "last") || !strcmp(v, "mean")))
            pooling = !strcmp(v, "mean") ? LLMS_POOLING_MEAN : LLMS_POOLING_LAST;
        else if (!strcmp(a, "--mode") && (!strcmp(v, "set") || !strcmp(v, "ordered")))
            ro.mode = !strcmp(v, "ordered") ? LLMS_RERANK_ORDERED : LLMS_RERANK_SET;
        else if (!strcmp(a, "--threshold"))
            ro.cv_threshold = (float)number(a, v);
        else if (!strcmp(a, "--precision"))
            ro.target_precision = (float)number(a, v);
        else if (!strcmp(a, "--socket"))
            socket_path = v;
        else if (!strcmp(a, "--app"))
            app = v;
        else if (!strcmp(a, "--context"))
            context = v;
        else if (!strcmp(a, "--system"))
            system = v;
        else if (!strcmp(a, "--temp"))
            p.temperature = (float)number(a, v);
        else if (!strcmp(a, "--max-tokens"))
            p.max_tokens = (int32_t)number(a, v);
        else if (!strcmp(a, "--seed")) {
            p.seed = (uint64_t)number(a, v);
            p.has_seed = 1;
        } else
            usage();
    }
    int valid = npos > 0 && ((!strcmp(pos[0], "ask") && npos == 2) ||
                             (!strcmp(pos[0], "chat") && npos == 1) ||
                             (!strcmp(pos[0], "ctx") && npos == 2 && !strcmp(pos[1], "list")) ||
                             (!strcmp(pos[0], "ctx") && npos == 3 &&
                              (!strcmp(pos[1], "show") || !strcmp(pos[1], "rm"))) ||
                             (!strcmp(pos[0], "embed") && npos >= 2) ||
                             (!strcmp(pos[0], "rerank") && npos >= 2 && query));
    if (!valid)
        usage();

    /* No SA_RESTART: Ctrl-C must not be lost inside a blocking read; the library
     * retries after EINTR and the next streamed piece sees the flag. */
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);

    llms_conn *c;
    char err[LLMS_ERROR_MAX];
    if (llms_connect(socket_path, &c, err) != LLMS_OK) {
        fprintf(stderr, "llms: %s\n", err);
        free(pos);
        return 1;
    }
    int rc = report(c, llms_bind(c, app), "bind");
    if (rc == 0) {
        if (!strcmp(pos[0], "ask"))
            rc = cmd_ask(c, &p, pos[1]);
        else if (!strcmp(pos[0], "chat"))
            rc = cmd_chat(c, &p, context, system);
        else if (!strcmp(pos[0], "embed"))
            rc = cmd_embed(c, pos + 1, npos - 1, pooling, json);
        else if (!strcmp(pos[0], "rerank"))
            rc = cmd_rerank(c, query, pos + 1, npos - 1, &ro, json);
        else
            rc = cmd_ctx(c, npos - 1, pos + 1);
    }
    llms_close(c);
    free(pos);
    return rc;
}
