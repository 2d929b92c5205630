/*
 * llms — the user's command line client of llmsd.
 *
 *   llms [options] ask [PROMPT | -] [-f FILE]  one-shot answer (nothing is kept)
 *   llms [options] chat [--context ID] [--system TEXT] [--overflow window|refuse]
 *                                              conversation; lines from stdin
 *   llms [options] ctx list | show ID | rm ID  the app's contexts
 *   llms [options] embed TEXT...               one vector per text
 *   llms [options] rerank -q QUERY [-k K] FILE...
 *                                              top-K of the files (each a document)
 *   llms [options] graph create NAME FILE | run NAME VAR=VALUE... | ls | rm NAME
 *                                              the app's workflow graphs (FILE: JSON)
 *
 * Why a reply stopped goes to stderr; a reply that was cut (context full, timeout,
 * daemon shutdown) ends with exit status 3 so that scripts can tell it from a whole one.
 */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "client/llms.h"
#include "engine/readall.h"
#include "engine/tok/utf8.h"

/* The daemon's own limit on max_tokens (daemon/config.c). */
#define MAX_TOKENS_LIMIT (1 << 24)

/* Exit status of a reply cut short by the daemon (see usage). */
#define EXIT_CUT 3

/* The signal (SIGINT, SIGTERM) that asked to stop, 0 while none has. */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = sig;
}

/* From here on SIGINT and SIGTERM cancel the call that streams (its callback sees the
 * flag at the next piece) instead of ending the program. Only right before such a call:
 * a call without pieces (bind, a listing, rag --json) could not see the flag, and the
 * library retries its read after EINTR, so a daemon that does not answer would leave the
 * program deaf to signals. No SA_RESTART: chat's read of stdin must see a signal too. */
static void catch_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void usage(void)
{
    printf("usage: llms [options] ask [PROMPT | -] [-f FILE]\n"
           "       llms [options] chat [--context ID] [--system TEXT] [--overflow window|refuse]\n"
           "       llms [options] ctx list | show ID | rm ID\n"
           "       llms [options] embed TEXT...\n"
           "       llms [options] rerank -q QUERY [-k K] FILE...\n"
           "       llms [options] kb create NAME [--share-uid] [--embed-model M] |\n"
           "                         add NAME FILE... | ls | rm NAME ID... | drop NAME\n"
           "       llms [options] rag NAME QUESTION [-k K] [--json] [--share-uid]\n"
           "       llms [options] graph create NAME FILE | run NAME VAR=VALUE... [--json] |\n"
           "                            ls | rm NAME\n"
           "       llms --help | --version\n"
           "\n"
           "commands:\n"
           "  ask      one answer, nothing kept; the prompt is PROMPT, or stdin when PROMPT\n"
           "           is - or absent and stdin is not a terminal, or FILE with -f\n"
           "  chat     a conversation kept by the daemon, one turn per line of stdin\n"
           "  ctx      list, show or remove the app's conversations\n"
           "  embed    one vector per text\n"
           "  rerank   the top-K of the files (each file one document) for the query\n"
           "  kb       the app's knowledge bases: create, add files (one document each, its\n"
           "           id the file name, which no two may share; all visible once added,\n"
           "           none if it fails; a progress bar on stderr when it is a terminal; an\n"
           "           interrupt cancels the add), list, remove documents by id, drop\n"
           "  rag      answer QUESTION from knowledge base NAME (passages, cache outcome and\n"
           "           times on stderr, or all of it as JSON with --json)\n"
           "  graph    the app's workflow graphs: create one from a JSON file, run one (an\n"
           "           app's or a built-in: one-shot, hyde, multistep, irg, recomp, with\n"
           "           inputs question=... kb=...; node events on stderr, the output on\n"
           "           stdout, or all of it as JSON with --json), list, remove\n"
           "\n"
           "options: --socket PATH  daemon socket (default $LLMS_SOCKET or %s)\n"
           "         --app NAME     the app whose contexts, kbs and graphs these are (default:\n"
           "                        $LLMS_APP, else \"" LLMS_DEFAULT_APP "\", as every client)\n"
           "         --temp T       ask, chat, rag, graph run: sampling temperature (0:\n"
           "                        greedy)\n"
           "         --max-tokens N ask, chat, rag, graph run: tokens to generate at most\n"
           "                        (1..%d)\n"
           "         --seed S       ask, chat, rag, graph run: sampling seed\n"
           "         --format json|text\n"
           "                        ask, chat: json: the reply is one JSON object (JSON\n"
           "                        mode; it ends as the object closes)\n"
           "         --schema F     ask, chat: the reply is an instance of the JSON Schema\n"
           "                        in file F (an object or an array at the top)\n"
           "         --grammar F    ask, chat: the reply is a sentence of the GBNF grammar\n"
           "                        in file F (llama.cpp's; the start rule is root)\n"
           "         --system TEXT  ask, new chat, rag: the system prompt\n"
           "         --context ID   chat: go on with this conversation\n"
           "         --overflow window|refuse\n"
           "                        new chat: when the context window fills, slide it (keep\n"
           "                        the start and the latest turns, go on) or refuse (cut the\n"
           "                        reply; the chat ends) (default: the daemon's, window)\n"
           "         -f, --file F   ask: read the prompt from file F\n"
           "         --json         embed, rerank, rag, graph run: JSON output\n"
           "         --share-uid    kb create: the knowledge base's caches are shared with\n"
           "                        the other apps of your uid whose knowledge bases are\n"
           "                        shared too (never with another uid); rag: the system\n"
           "                        prompt's cached KV is shared with your uid's apps that\n"
           "                        ask so\n"
           "         --model NAME   ask, new chat, embed, rerank: the daemon's model of that\n"
           "                        name (llmsctl models), else the default for the kind\n"
           "         --speculate on|off       graph run: speculate (start nodes on provisional\n"
           "                                  inputs, redo them when the final ones differ)\n"
           "                                  or not (default: the daemon's graph_speculate)\n"
           "         --speculate off|lookup|draft|both\n"
           "                                  ask, chat, rag: speculative decoding, several\n"
           "                                  tokens verified per step (lookup: those that\n"
           "                                  followed the reply's last few earlier in its\n"
           "                                  context; draft: the daemon's draft model's;\n"
           "                                  the same greedy text) or not (default: the\n"
           "                                  daemon's speculate)\n"
           "         --pooling last|mean|cls  embed: token pooling (default: the model's\n"
           "                                  pooling_type, else last on a decoder, cls\n"
           "                                  on an encoder)\n"
           "         --embed-model M          kb create: the daemon's embed model that\n"
           "                                  embeds the knowledge base, for its life\n"
           "                                  (default: the daemon's default embed model)\n"
           "         -q, --query TEXT         rerank: the query\n"
           "         -k, --top-k K            rerank: documents to select (default 5); rag:\n"
           "                                  passages in the prompt (default: the daemon's\n"
           "                                  rag_top_k)\n"
           "         --mode set|ordered       rerank: exact membership or exact order\n"
           "         --threshold T            rerank: pruning threshold (0: none)\n"
           "         --precision P            rerank: use the threshold calibrated for P\n"
           "         --                       the rest are arguments (a prompt starting with -)\n"
           "\n"
           "Why each reply stopped is written to stderr. Exit status: 0 done (a reply ended\n"
           "by the model, a stop string or --max-tokens), 1 an error (output that could not\n"
           "be written too), 2 bad usage, 3 a reply was cut (context full, timeout, daemon\n"
           "shutdown), 128+N interrupted by signal N.\n",
           LLMS_DEFAULT_SOCKET, MAX_TOKENS_LIMIT);
}

/* A mistake on the command line: what is wrong, and where help is. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("llms: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(llms --help lists the commands and options)\n", stderr);
    exit(2);
}

/* Streams each piece of a reply as it arrives; Ctrl-C (or SIGTERM) cancels the call. */
static int print_text(const char *text, size_t len, void *user)
{
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return interrupted != 0;
}

static int report(llms_conn *c, enum llms_status s, const char *what)
{
    if (s == LLMS_OK)
        return 0;
    fprintf(stderr, "llms: %s: %s (%s)\n", what, llms_last_error(c), llms_status_name(s));
    return 1;
}

static void format_time(uint64_t unix_ms, char *buf, size_t cap)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
}

/* Whether a reply that stopped for r is whole: ended by the model, a stop string or the
 * caller's own token limit. */
static int reply_whole(enum llms_stop_reason r)
{
    return r == LLMS_STOP_EOS || r == LLMS_STOP_STRING || r == LLMS_STOP_MAX_TOKENS;
}

/* Says on stderr why a reply stopped (always) and, for a cut reply, what cut it. */
static void tell_stop(enum llms_stop_reason why, uint32_t generated_tokens,
                      uint32_t prompt_tokens)
{
    fprintf(stderr, "llms: stop: %s; %" PRIu32 " tokens generated, prompt %" PRIu32 " tokens\n",
            llms_stop_reason_name(why), generated_tokens, prompt_tokens);
    switch (why) {
    case LLMS_STOP_CONTEXT_FULL:
        fputs("llms: the reply was cut: the context window is full (its overflow is refuse)\n",
              stderr);
        break;
    case LLMS_STOP_DEADLINE:
        fputs("llms: the reply was cut: the request's timeout passed\n", stderr);
        break;
    case LLMS_STOP_CANCELLED:
        fputs("llms: the reply was cut: the daemon cancelled it\n", stderr);
        break;
    case LLMS_STOP_SHUTDOWN:
        fputs("llms: the reply was cut: the daemon is shutting down\n", stderr);
        break;
    default:
        break;
    }
}

/* The exit status after a call the user interrupted with a signal. */
static int tell_interrupted(void)
{
    fprintf(stderr, "llms: %s: the reply was cancelled\n", strsignal(interrupted));
    return 128 + interrupted;
}

static int cmd_ask(llms_conn *c, const llms_params *p, const char *prompt, const char *system)
{
    llms_result r;
    catch_signals();
    enum llms_status s = llms_complete(c, prompt, system, 1, p, print_text, NULL, &r);
    if (s == LLMS_OK || s == LLMS_ERR_CANCELLED)
        printf("\n");
    fflush(stdout);
    int rc;
    if (s == LLMS_ERR_CANCELLED && interrupted) {
        rc = tell_interrupted();
    } else if (s == LLMS_OK) {
        tell_stop(r.stop_reason, r.generated_tokens, r.prompt_tokens);
        rc = reply_whole(r.stop_reason) ? 0 : EXIT_CUT;
    } else {
        rc = report(c, s, "ask");
    }
    llms_result_free(&r);
    return rc;
}

/* Whether a chat can go on after a turn failed with s: not when the connection, the
 * daemon or the context is gone. */
static int chat_can_go_on(enum llms_status s)
{
    return s != LLMS_ERR_IO && s != LLMS_ERR_PROTOCOL && s != LLMS_ERR_UNAVAILABLE &&
           s != LLMS_ERR_NOT_FOUND;
}

static int cmd_chat(llms_conn *c, const llms_params *p, const char *context, const char *system,
                    enum llms_overflow overflow)
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
        /* only the model: a chat's sampling settings go with each turn */
        llms_params cp;
        llms_params_init(&cp);
        cp.model = p->model;
        if ((s = llms_context_create_overflow(c, system, &cp, overflow, id)) != LLMS_OK)
            return report(c, s, "creating a context");
        fprintf(stderr, "context %s (resume with: llms chat --context %s)\n", id, id);
    }

    catch_signals();
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
        if (n < 0) {
            /* a signal while waiting for a line ends the chat as one during a reply does */
            if (interrupted)
                rc = 128 + interrupted;
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0)
            continue;
        interrupted = 0;
        llms_result r;
        s = llms_call(c, id, line, p, print_text, NULL, &r);
        if (s == LLMS_OK || s == LLMS_ERR_CANCELLED)
            printf("\n");
        fflush(stdout);
        /* A turn that ends the natural way needs no word. */
        enum llms_stop_reason why = r.stop_reason;
        if (s == LLMS_OK && why != LLMS_STOP_EOS && why != LLMS_STOP_STRING)
            tell_stop(why, r.generated_tokens, r.prompt_tokens);
        if (s == LLMS_OK && r.window_slides)
            fprintf(stderr, "llms: the context window slid %" PRIu32 " time%s: the oldest turns "
                    "after the start are out of the model's view\n", r.window_slides,
                    r.window_slides == 1 ? "" : "s");
        llms_result_free(&r);
        if (s == LLMS_ERR_CANCELLED && interrupted == SIGINT) {
            /* Ctrl-C cuts this reply only; the next line is the next turn. */
            fputs("llms: interrupted: the reply was cancelled\n", stderr);
            continue;
        }
        if (s == LLMS_ERR_CANCELLED && interrupted) {
            rc = tell_interrupted();
            break;
        }
        if (s != LLMS_OK) {
            rc = report(c, s, "chat");
            if (!chat_can_go_on(s))
                break;
            continue;
        }
        if (why == LLMS_STOP_CONTEXT_FULL || why == LLMS_STOP_SHUTDOWN) {
            rc = EXIT_CUT;
            break;
        }
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
            printf("%s  %6" PRIu32 " tokens  %-8s  last used %s%s\n", infos[i].id,
                   infos[i].n_tokens, llms_memory_name(infos[i].memory), used,
                   infos[i].damage ? "  DAMAGED" : "");
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
               "last used %s\noverflow  %s (window slid %" PRIu64 " times, %" PRIu64
               " tokens out of view)\n",
               info.id, info.n_tokens, llms_memory_name(info.memory), created, used,
               llms_overflow_name(info.overflow), info.window_slides,
               info.window_dropped_tokens);
        if (info.damage)
            printf("DAMAGED   %s\n          (its calls fail; `llms ctx rm %s` clears it)\n",
                   info.damage, info.id);
        for (size_t i = 0; i < info.n_history; i++)
            printf("\n[%s]\n%s\n", info.history[i].role, info.history[i].content);
        llms_context_info_free(&info);
        return 0;
    }
    return report(c, llms_context_delete(c, argv[1]), argv[1]);
}

static int cmd_embed(llms_conn *c, const char *model, char **texts, int n,
                     enum llms_pooling pooling, int json)
{
    llms_embeddings e;
    enum llms_status s =
        llms_embed_model(c, model, (const char *const *)texts, (size_t)n, pooling, &e);
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

/* The whole file at path (NUL-terminated), or NULL after a message. */
static char *read_file(const char *path)
{
    char err[ERR_MAX];
    char *buf = readall_file(path, NULL, err);
    if (!buf)
        fprintf(stderr, "llms: %s: %s\n", path, err);
    return buf;
}

/* The prompt of ask: from -f FILE, from stdin, or the argument itself; line ends at its
 * end are dropped (echo and editors add one). NULL after a message; *owned is what to
 * free. */
static const char *ask_prompt(const char *arg, const char *file, char **owned)
{
    *owned = NULL;
    if (file) {
        *owned = read_file(file);
    } else if (!arg || !strcmp(arg, "-")) {
        char err[ERR_MAX];
        if (!(*owned = readall_stream(stdin, NULL, err)))
            fprintf(stderr, "llms: stdin: %s\n", err);
    } else {
        return arg;
    }
    if (!*owned)
        return NULL;
    size_t n = strlen(*owned);
    while (n > 0 && ((*owned)[n - 1] == '\n' || (*owned)[n - 1] == '\r'))
        (*owned)[--n] = '\0';
    return *owned;
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
        /* The order is a ranking only when every score is final (see llms_rerank_hit),
         * or when there is one hit. */
        int ranked = 1;
        for (size_t i = 0; i < r.n_hits; i++)
            ranked &= !isnan(r.hits[i].score);
        ranked |= r.n_hits <= 1;
        if (json) {
            printf("{\"hits\": [");
            for (size_t i = 0; i < r.n_hits; i++) {
                char rank[32] = "null", score[32] = "null";
                if (ranked)
                    snprintf(rank, sizeof rank, "%zu", i + 1);
                if (!isnan(r.hits[i].score))
                    snprintf(score, sizeof score, "%.6g", r.hits[i].score);
                printf("%s{\"rank\": %s, \"index\": %" PRIu32 ", \"score\": %s, \"file\": ",
                       i ? ", " : "", rank, r.hits[i].index, score);
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
            for (size_t i = 0; i < r.n_hits; i++) {
                char rank[32] = "   -", score[32] = "        -";
                if (ranked)
                    snprintf(rank, sizeof rank, "%4zu", i + 1);
                if (!isnan(r.hits[i].score))
                    snprintf(score, sizeof score, "%.6f", r.hits[i].score);
                printf("%s  %5" PRIu32 "  %s  %s\n", rank, r.hits[i].index, score,
                       files[r.hits[i].index]);
            }
            if (!ranked)
                printf("(set mode: the top %zu as a set; documents chosen before the last "
                       "layer have no final score, so no rank; --mode ordered ranks them)\n",
                       r.n_hits);
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

/* A number option's value, or exit naming the option and why. */
static double number(const char *opt, const char *v)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        bad_usage("%s: '%s' is not a number", opt, v);
    return x;
}

/* An integer option's value in [lo, hi], or exit naming the option and why. */
static unsigned long long integer(const char *opt, const char *v, unsigned long long lo,
                                  unsigned long long hi)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x < lo || x > hi)
        bad_usage("%s: '%s' is not an integer from %llu to %llu", opt, v, lo, hi);
    return x;
}

/* The options that take a value; every other option is a flag. */
static int takes_value(const char *a)
{
    static const char *const with_value[] = {
        "-q", "--query", "-k", "--top-k", "--pooling", "--mode", "--threshold",
        "--precision", "--socket", "--app", "--context", "--system", "--temp",
        "--max-tokens", "--seed", "-f", "--file", "--overflow", "--model", "--speculate",
        "--format", "--schema", "--grammar",
        "--embed-model"};
    for (size_t i = 0; i < sizeof with_value / sizeof with_value[0]; i++)
        if (!strcmp(a, with_value[i]))
            return 1;
    return 0;
}

/* The commands each option applies to; --socket and --app apply to all. */
static const char *option_commands(const char *a)
{
    if (!strcmp(a, "--temp") || !strcmp(a, "--max-tokens") || !strcmp(a, "--seed"))
        return "ask chat rag graph";
    if (!strcmp(a, "--system"))
        return "ask chat rag";
    if (!strcmp(a, "--context") || !strcmp(a, "--overflow"))
        return "chat";
    if (!strcmp(a, "-f") || !strcmp(a, "--file"))
        return "ask";
    if (!strcmp(a, "--pooling"))
        return "embed";
    if (!strcmp(a, "--json"))
        return "embed rerank rag graph";
    if (!strcmp(a, "--share-uid"))
        return "kb rag";
    if (!strcmp(a, "--embed-model"))
        return "kb";
    if (!strcmp(a, "--speculate"))
        return "graph ask chat rag";
    if (!strcmp(a, "--format") || !strcmp(a, "--schema") || !strcmp(a, "--grammar"))
        return "ask chat";
    if (!strcmp(a, "--model"))
        return "ask chat embed rerank";
    if (!strcmp(a, "-k") || !strcmp(a, "--top-k"))
        return "rerank rag";
    if (!strcmp(a, "--socket") || !strcmp(a, "--app"))
        return NULL;
    return "rerank";
}

/* Whether the space-separated list holds word. */
static int has_word(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    return 0;
}

/* Exits with a message unless the positional arguments fit the command pos[0]. */
static void check_command(char **pos, int npos, const char *query, const char *file)
{
    if (npos == 0)
        bad_usage("no command (ask, chat, ctx, embed, rerank, kb, rag or graph)");
    const char *cmd = pos[0];
    if (!strcmp(cmd, "ask")) {
        if (npos > 2)
            bad_usage("ask: one prompt (quote it), got %d arguments", npos - 1);
        if (file && npos == 2)
            bad_usage("ask: a prompt argument and -f FILE: give one of them");
        if (!file && npos == 1 && isatty(STDIN_FILENO))
            bad_usage("ask: no prompt (give PROMPT, -f FILE, or pipe it on stdin)");
    } else if (!strcmp(cmd, "chat")) {
        if (npos > 1)
            bad_usage("chat: no arguments (turns are read from stdin), got '%s'", pos[1]);
    } else if (!strcmp(cmd, "ctx")) {
        int list = npos == 2 && !strcmp(pos[1], "list");
        int one = npos == 3 && (!strcmp(pos[1], "show") || !strcmp(pos[1], "rm"));
        if (!list && !one)
            bad_usage("ctx: expected 'list', 'show ID' or 'rm ID'");
    } else if (!strcmp(cmd, "embed")) {
        if (npos < 2)
            bad_usage("embed: no texts");
    } else if (!strcmp(cmd, "rerank")) {
        if (!query)
            bad_usage("rerank: no query (-q QUERY)");
        if (npos < 2)
            bad_usage("rerank: no documents (FILE...)");
    } else if (!strcmp(cmd, "kb")) {
        const char *sub = npos >= 2 ? pos[1] : "";
        int ok = (!strcmp(sub, "ls") && npos == 2) ||
                 ((!strcmp(sub, "create") || !strcmp(sub, "drop")) && npos == 3) ||
                 ((!strcmp(sub, "add") || !strcmp(sub, "rm")) && npos >= 4);
        if (!ok)
            bad_usage("kb: expected 'create NAME', 'add NAME FILE...', 'ls', 'rm NAME ID...' "
                      "or 'drop NAME'");
    } else if (!strcmp(cmd, "rag")) {
        if (npos != 3)
            bad_usage("rag: expected NAME and one QUESTION (quote it)");
    } else if (!strcmp(cmd, "graph")) {
        const char *sub = npos >= 2 ? pos[1] : "";
        int ok = (!strcmp(sub, "ls") && npos == 2) || (!strcmp(sub, "rm") && npos == 3) ||
                 (!strcmp(sub, "create") && npos == 4) || (!strcmp(sub, "run") && npos >= 3);
        if (!ok)
            bad_usage("graph: expected 'create NAME FILE', 'run NAME VAR=VALUE...', 'ls' or "
                      "'rm NAME'");
    } else {
        bad_usage("unknown command '%s'", cmd);
    }
}

/* kb add's progress: on stderr when it is a terminal (*user), one line redrawn in place:
 * the phase, its share done and its counts. Nonzero (the add cancelled, nothing of it
 * visible) once a signal interrupted. */
static int kb_progress_bar(const llms_kb_progress *p, void *user)
{
    enum { WIDTH = 30 };
    if (*(const int *)user) {
        const char *phase = "write", *unit = "passages";
        uint64_t done = p->passages_written, total = p->passages;
        if (p->phase == LLMS_KB_SPLIT) {
            phase = "split";
            unit = "KiB";
            done = (p->bytes_split + 1023) >> 10;
            total = (p->bytes + 1023) >> 10;
        } else if (p->phase == LLMS_KB_EMBED) {
            phase = "embed";
            done = p->passages_embedded;
        }
        int fill = total ? (int)(done * WIDTH / total) : WIDTH;
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++)
            bar[i] = i < fill ? '#' : ' ';
        bar[WIDTH] = '\0';
        fprintf(stderr, "\rkb add: %s [%s] %3d%% %" PRIu64 "/%" PRIu64 " %s, %" PRIu32 "/%" PRIu32
                        " documents written\033[K",
                phase, bar, total ? (int)(done * 100 / total) : 100, done, total, unit,
                p->documents_written, p->documents);
        fflush(stderr);
    }
    return interrupted != 0;
}

static int cmd_kb(llms_conn *c, int argc, char **argv, int share_uid, const char *embed_model)
{
    const char *sub = argv[0];
    if (share_uid && strcmp(sub, "create"))
        bad_usage("kb %s: --share-uid applies to kb create only", sub);
    if (embed_model && strcmp(sub, "create"))
        bad_usage("kb %s: --embed-model applies to kb create only", sub);
    if (!strcmp(sub, "create")) {
        llms_kb_options o = {.share_uid = share_uid, .embed_model = embed_model};
        return report(c, llms_kb_create_opts(c, argv[1], &o), "kb create");
    }
    if (!strcmp(sub, "drop"))
        return report(c, llms_kb_drop(c, argv[1]), "kb drop");
    if (!strcmp(sub, "rm")) {
        uint32_t removed = 0;
        int rc = report(c, llms_kb_remove(c, argv[1], (const char *const *)argv + 2,
                                          (size_t)argc - 2, &removed), "kb rm");
        if (rc == 0)
            printf("removed %" PRIu32 " of %d documents\n", removed, argc - 2);
        return rc;
    }
    if (!strcmp(sub, "add")) {
        int n = argc - 2, rc = 0;
        llms_kb_doc *docs = calloc((size_t)n, sizeof *docs);
        char **texts = calloc((size_t)n, sizeof *texts);
        if (!docs || !texts)
            rc = 1;
        for (int i = 0; i < n && rc == 0; i++) {
            const char *path = argv[2 + i], *slash = strrchr(path, '/');
            if (!(texts[i] = read_file(path)))
                rc = 1;
            docs[i] = (llms_kb_doc){slash ? slash + 1 : path, texts[i], path};
        }
        uint32_t passages = 0;
        int tty = isatty(STDERR_FILENO);
        if (rc == 0) {
            catch_signals();
            enum llms_status s = llms_kb_add_progress(c, argv[1], docs, (size_t)n,
                                                      kb_progress_bar, &tty, &passages);
            if (tty)
                fputs("\r\033[K", stderr);
            rc = s == LLMS_ERR_CANCELLED && interrupted ? tell_interrupted()
                                                         : report(c, s, "kb add");
        }
        if (rc == 0)
            printf("added %d documents, %" PRIu32 " passages\n", n, passages);
        for (int i = 0; texts && i < n; i++)
            free(texts[i]);
        free(texts);
        free(docs);
        return rc;
    }
    llms_kb_info *kbs;
    size_t n;
    int rc = report(c, llms_kb_list(c, &kbs, &n), "kb ls");
    if (rc)
        return rc;
    printf("%-24s %9s %9s %12s %6s %8s %-6s %s\n", "NAME", "DOCS", "PASSAGES", "BYTES",
           "TOKENS", "QA", "CACHES", "EMBED_MODEL");
    for (size_t i = 0; i < n; i++)
        printf("%-24s %9" PRIu32 " %9" PRIu32 " %12" PRIu64 " %6" PRIu32 " %8" PRIu32
               " %-6s %s\n", kbs[i].name, kbs[i].documents, kbs[i].passages, kbs[i].bytes,
               kbs[i].passage_tokens, kbs[i].qa_entries, kbs[i].share_uid ? "uid" : "app",
               kbs[i].embed_model[0] ? kbs[i].embed_model : "-");
    llms_kb_list_free(kbs, n);
    return 0;
}

static int cmd_rag(llms_conn *c, const char *kb, const char *question, uint32_t top_k,
                   const char *system, const llms_params *p, int json, int share_system_uid)
{
    llms_rag_options o = {.top_k = top_k, .retrieval = LLMS_RETRIEVAL_RRF,
                          .system_prompt = system, .params = p,
                          .share_system_uid = share_system_uid};
    llms_rag_result r;
    if (!json)
        catch_signals();
    enum llms_status s =
        llms_rag_query(c, kb, question, &o, json ? NULL : print_text, NULL, &r);
    if (s == LLMS_ERR_CANCELLED && interrupted) {
        printf("\n");
        fflush(stdout);
        llms_rag_result_free(&r);
        return tell_interrupted();
    }
    int rc = report(c, s, "rag");
    if (rc)
        return rc;
    if (json) {
        printf("{\"outcome\": \"%s\", \"answer\": ", llms_rag_outcome_name(r.outcome));
        utf8_json_string(stdout, r.text);
        printf(", \"passages\": [");
        for (size_t i = 0; i < r.n_passages; i++) {
            printf("%s{\"passage\": %" PRIu64 ", \"document\": ", i ? ", " : "",
                   r.passages[i].passage);
            utf8_json_string(stdout, r.passages[i].document);
            printf(", \"seq\": %" PRIu32 ", \"score\": %.6g}", r.passages[i].seq,
                   r.passages[i].score);
        }
        printf("], \"prompt_tokens\": %" PRIu32 ", \"reused_tokens\": %" PRIu32
               ", \"reused_passages\": %" PRIu32 ", \"generated_tokens\": %" PRIu32
               ", \"retrieve_ms\": %.3f, \"prefill_ms\": %.3f, \"decode_ms\": %.3f"
               ", \"queue_ms\": %.3f, \"stop_reason\": \"%s\"}\n",
               r.prompt_tokens, r.reused_tokens, r.reused_passages, r.generated_tokens,
               r.retrieve_ms, r.prefill_ms, r.decode_ms, r.queue_ms,
               llms_stop_reason_name(r.stop_reason));
    } else {
        /* The answer leaves before the passages: stdout into a pipe is fully buffered, and
         * stderr is not buffered at all. */
        printf("\n");
        fflush(stdout);
        for (size_t i = 0; i < r.n_passages; i++)
            fprintf(stderr, "[%zu] %s#%" PRIu32 " (score %.4g)\n", i + 1, r.passages[i].document,
                    r.passages[i].seq, r.passages[i].score);
        fprintf(stderr, "[%s: %" PRIu32 " prompt tokens, %" PRIu32 " reused, retrieve %.1f ms, "
                        "prefill %.1f ms, decode %.1f ms]\n",
                llms_rag_outcome_name(r.outcome), r.prompt_tokens, r.reused_tokens,
                r.retrieve_ms, r.prefill_ms, r.decode_ms);
        tell_stop(r.stop_reason, r.generated_tokens, r.prompt_tokens);
    }
    /* an answer is a reply: a cut one ends with EXIT_CUT, as ask's does */
    rc = reply_whole(r.stop_reason) ? 0 : EXIT_CUT;
    llms_rag_result_free(&r);
    return rc;
}

/* ---- graphs ---- */

/* A graph definition read from JSON: every string points into the parsed document. */
typedef struct json_graph {
    json_object *root;
    const char **inputs;
    llms_graph_node *nodes;
    llms_params *params;
    llms_graph_edge *edges;
    llms_graph_def def;
} json_graph;

static void json_graph_free(json_graph *g)
{
    json_object_put(g->root);
    free(g->inputs);
    free(g->nodes);
    free(g->params);
    free(g->edges);
}

/* The string member key of o (NULL when absent; -1 when not a string). */
static int json_str(json_object *o, const char *key, const char **out)
{
    json_object *v;
    *out = NULL;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
        return 0;
    if (!json_object_is_type(v, json_type_string))
        return -1;
    *out = json_object_get_string(v);
    return 0;
}

/* The array member key of o (n 0 when absent); -1 when not an array. */
static int json_array(json_object *o, const char *key, json_object **arr, size_t *n)
{
    *n = 0;
    if (!json_object_object_get_ex(o, key, arr))
        return 0;
    if (!json_object_is_type(*arr, json_type_array))
        return -1;
    *n = json_object_array_length(*arr);
    return 0;
}

static int json_node(json_object *o, llms_graph_node *n, llms_params *p, size_t i)
{
    const char *kind = NULL, *retrieval = NULL;
    json_object *v;
    if (!json_object_is_type(o, json_type_object) || json_str(o, "name", &n->name) ||
        json_str(o, "kind", &kind) || json_str(o, "output", &n->output) ||
        json_str(o, "prompt", &n->prompt) || json_str(o, "kb", &n->kb) ||
        json_str(o, "query", &n->query) || json_str(o, "retrieval", &retrieval)) {
        fprintf(stderr, "llms: graph: node %zu: not an object of strings\n", i);
        return -1;
    }
    if (!kind || (strcmp(kind, "generate") && strcmp(kind, "retrieve"))) {
        fprintf(stderr, "llms: graph: node %zu: kind must be \"generate\" or \"retrieve\"\n", i);
        return -1;
    }
    n->kind = !strcmp(kind, "retrieve") ? LLMS_GRAPH_RETRIEVE : LLMS_GRAPH_GENERATE;
    static const char *const modes[] = {"rrf", "sum", "bm25", "vector"};
    for (int m = 0; retrieval && m < 4; m++)
        if (!strcmp(retrieval, modes[m])) {
            n->retrieval = (enum llms_retrieval)m;
            retrieval = NULL;
        }
    if (retrieval) {
        fprintf(stderr, "llms: graph: node %zu: retrieval is rrf, sum, bm25 or vector\n", i);
        return -1;
    }
    if (json_object_object_get_ex(o, "top_k", &v))
        n->top_k = (uint32_t)json_object_get_int(v);
    if (json_object_object_get_ex(o, "chat", &v))
        n->chat = json_object_get_boolean(v);
    llms_params_init(p);
    if (json_object_object_get_ex(o, "temperature", &v)) {
        p->temperature = (float)json_object_get_double(v);
        n->params = p;
    }
    if (json_object_object_get_ex(o, "max_tokens", &v)) {
        p->max_tokens = json_object_get_int(v);
        n->params = p;
    }
    return 0;
}

/*
 * Reads a graph from JSON:
 *   {"inputs": ["question"], "output": "answer", "max_steps": 8,
 *    "nodes": [{"name": "n", "kind": "generate" | "retrieve", "output": "var",
 *               "prompt": "...", "chat": false, "temperature": 0, "max_tokens": 64,
 *               "kb": "...", "query": "...", "top_k": 3, "retrieval": "rrf"}, ...],
 *    "edges": [{"from": "START", "to": "n", "when": "..."}, ...]}
 */
static int json_graph_read(const char *path, json_graph *g)
{
    memset(g, 0, sizeof *g);
    char *text = read_file(path);
    if (!text)
        return -1;
    json_tokener *tok = json_tokener_new();
    g->root = tok ? json_tokener_parse_ex(tok, text, (int)strlen(text)) : NULL;
    if (!g->root) {
        fprintf(stderr, "llms: %s: not JSON (%s)\n", path,
                tok ? json_tokener_error_desc(json_tokener_get_error(tok)) : "out of memory");
        json_tokener_free(tok);
        free(text);
        return -1;
    }
    json_tokener_free(tok);
    free(text);
    json_object *inputs, *nodes, *edges, *v;
    size_t ni, nn, ne;
    if (!json_object_is_type(g->root, json_type_object) ||
        json_array(g->root, "inputs", &inputs, &ni) || json_array(g->root, "nodes", &nodes, &nn) ||
        json_array(g->root, "edges", &edges, &ne) || json_str(g->root, "output", &g->def.output)) {
        fprintf(stderr, "llms: %s: expected an object with arrays inputs, nodes, edges and a "
                        "string output\n", path);
        return -1;
    }
    g->inputs = calloc(ni + 1, sizeof *g->inputs);
    g->nodes = calloc(nn + 1, sizeof *g->nodes);
    g->params = calloc(nn + 1, sizeof *g->params);
    g->edges = calloc(ne + 1, sizeof *g->edges);
    if (!g->inputs || !g->nodes || !g->params || !g->edges)
        return -1;
    for (size_t i = 0; i < ni; i++)
        g->inputs[i] = json_object_get_string(json_object_array_get_idx(inputs, i));
    for (size_t i = 0; i < nn; i++)
        if (json_node(json_object_array_get_idx(nodes, i), &g->nodes[i], &g->params[i], i))
            return -1;
    for (size_t i = 0; i < ne; i++) {
        json_object *e = json_object_array_get_idx(edges, i);
        if (!json_object_is_type(e, json_type_object) || json_str(e, "from", &g->edges[i].from) ||
            json_str(e, "to", &g->edges[i].to) || json_str(e, "when", &g->edges[i].when)) {
            fprintf(stderr, "llms: %s: edge %zu: expected from, to and when strings\n", path, i);
            return -1;
        }
    }
    if (json_object_object_get_ex(g->root, "max_steps", &v))
        g->def.max_steps = (uint32_t)json_object_get_int(v);
    g->def.inputs = g->inputs;
    g->def.n_inputs = ni;
    g->def.nodes = g->nodes;
    g->def.n_nodes = nn;
    g->def.edges = g->edges;
    g->def.n_edges = ne;
    return 0;
}

static int print_graph_event(const llms_graph_event *ev, void *user)
{
    (void)user;
    if (ev->finished)
        fprintf(stderr, "[%" PRIu32 "] %s -> %s (%.1f ms%s%s)\n", ev->step, ev->node,
                ev->output, ev->ms, ev->generated_tokens ? ", generated" : "",
                ev->speculation == LLMS_GRAPH_SPEC_HIT        ? ", speculation kept"
                : ev->speculation == LLMS_GRAPH_SPEC_ROLLBACK ? ", speculation redone"
                                                              : "");
    else
        fprintf(stderr, "[%" PRIu32 "] %s ...\n", ev->step, ev->node);
    return interrupted != 0;
}

static int cmd_graph_run(llms_conn *c, const char *name, char **vars, int n,
                         const llms_params *p, enum llms_speculate spec, int json)
{
    llms_graph_var *in = calloc((size_t)n + 1, sizeof *in);
    if (!in)
        return 1;
    for (int i = 0; i < n; i++) {
        char *eq = strchr(vars[i], '=');
        if (!eq) {
            free(in);
            bad_usage("graph run: inputs are VAR=VALUE, got '%s'", vars[i]);
        }
        *eq = '\0';
        in[i] = (llms_graph_var){vars[i], eq + 1};
    }
    llms_graph_result r;
    if (!json)
        catch_signals();
    int rc = report(c, llms_graph_run_speculate(c, name, in, (size_t)n, p, spec,
                                                json ? NULL : print_graph_event, NULL, &r),
                    "graph run");
    free(in);
    if (rc)
        return interrupted ? tell_interrupted() : rc;
    if (json) {
        printf("{\"output\": ");
        utf8_json_string(stdout, r.output);
        printf(", \"steps\": %" PRIu32 ", \"capped\": %s, \"total_ms\": %.3f, "
               "\"queue_ms\": %.3f, \"speculations\": %" PRIu32 ", \"spec_hits\": %" PRIu32
               ", \"spec_rollbacks\": %" PRIu32 ", \"spec_saved_ms\": %.3f, \"prompt_tokens\": %"
               PRIu32 ", \"reused_tokens\": %" PRIu32 ", \"nodes\": [",
               r.steps, r.capped ? "true" : "false", r.total_ms, r.queue_ms, r.speculations,
               r.spec_hits, r.spec_rollbacks, r.spec_saved_ms, r.prompt_tokens, r.reused_tokens);
        for (size_t i = 0; i < r.n_timings; i++) {
            printf("%s{\"node\": ", i ? ", " : "");
            utf8_json_string(stdout, r.timings[i].node);
            printf(", \"runs\": %" PRIu32 ", \"ms\": %.3f, \"generated_tokens\": %" PRIu32 "}",
                   r.timings[i].runs, r.timings[i].ms, r.timings[i].generated_tokens);
        }
        printf("], \"state\": {");
        for (size_t i = 0; i < r.n_state; i++) {
            printf("%s", i ? ", " : "");
            utf8_json_string(stdout, r.state_names[i]);
            printf(": ");
            utf8_json_string(stdout, r.state_values[i]);
        }
        printf("}}\n");
    } else {
        printf("%s\n", r.output);
        fprintf(stderr, "[%" PRIu32 " node runs%s, %.1f ms; %" PRIu32 " of %" PRIu32
                " prompt tokens from the previous node's KV; speculation: %" PRIu32 " hits, %"
                PRIu32 " rollbacks]\n", r.steps, r.capped ? ", stopped at the step cap" : "",
                r.total_ms, r.reused_tokens, r.prompt_tokens, r.spec_hits, r.spec_rollbacks);
    }
    llms_graph_result_free(&r);
    return 0;
}

static int cmd_graph(llms_conn *c, int argc, char **argv, const llms_params *p,
                     enum llms_speculate spec, int json)
{
    const char *sub = argv[0];
    if (!strcmp(sub, "rm"))
        return report(c, llms_graph_delete(c, argv[1]), "graph rm");
    if (!strcmp(sub, "run"))
        return cmd_graph_run(c, argv[1], argv + 2, argc - 2, p, spec, json);
    if (!strcmp(sub, "create")) {
        json_graph g;
        int rc = json_graph_read(argv[2], &g) ? 1
                 : report(c, llms_graph_create(c, argv[1], &g.def), "graph create");
        json_graph_free(&g);
        return rc;
    }
    llms_graph_info *gs;
    size_t n;
    int rc = report(c, llms_graph_list(c, &gs, &n), "graph ls");
    if (rc)
        return rc;
    printf("%-24s %-8s %5s %5s %9s  %s\n", "NAME", "KIND", "NODES", "EDGES", "MAX_STEPS",
           "INPUTS -> OUTPUT");
    for (size_t i = 0; i < n; i++) {
        /* 0 is no cap of its own: an acyclic graph runs each node at most once */
        char steps[16] = "-";
        if (gs[i].max_steps)
            snprintf(steps, sizeof steps, "%" PRIu32, gs[i].max_steps);
        printf("%-24s %-8s %5zu %5zu %9s  ", gs[i].name, gs[i].builtin ? "built-in" : "app",
               gs[i].n_nodes, gs[i].n_edges, steps);
        for (size_t k = 0; k < gs[i].n_inputs; k++)
            printf("%s%s", k ? "," : "", gs[i].inputs[k]);
        printf(" -> %s\n", gs[i].output);
    }
    llms_graph_list_free(gs, n);
    return 0;
}

/* What the command line asks for. */
typedef struct cli {
    const char *socket_path, *app, *context, *system, *query, *file, *embed_model;
    /* --schema or --grammar: the file, the option and the format it asks for */
    const char *format_file, *format_option;
    enum llms_format file_format;
    int json, share_uid;
    enum llms_overflow overflow;
    enum llms_pooling pooling;
    const char *speculate_value; /* --speculate as given: a graph's or a generation's */
    enum llms_speculate graph_spec; /* a graph's, from speculate_value */
    llms_rerank_options ro;
    llms_params p;
    char **pos;                  /* (npos) the command and its arguments */
    int npos;
    const char **opts;           /* (nopts) the options given, to check they apply */
    int nopts;
} cli;

/* Sets the option a that takes the value v. */
static void read_option(cli *o, const char *a, const char *v)
{
    llms_params *p = &o->p;
    if (!strcmp(a, "-q") || !strcmp(a, "--query"))
        o->query = v;
    else if (!strcmp(a, "-k") || !strcmp(a, "--top-k"))
        o->ro.top_k = (uint32_t)integer(a, v, 1, UINT32_MAX);
    else if (!strcmp(a, "--pooling")) {
        if (strcmp(v, "last") && strcmp(v, "mean") && strcmp(v, "cls"))
            bad_usage("--pooling: expected last, mean or cls, got '%s'", v);
        o->pooling = !strcmp(v, "mean")  ? LLMS_POOLING_MEAN
                     : !strcmp(v, "cls") ? LLMS_POOLING_CLS
                                         : LLMS_POOLING_LAST;
    } else if (!strcmp(a, "--speculate")) {
        /* graph runs speculate on their inputs, generations on their tokens */
        if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "lookup") && strcmp(v, "draft") &&
            strcmp(v, "both"))
            bad_usage("--speculate: expected on or off (graph), off, lookup, draft or both "
                      "(ask, chat, rag), got '%s'", v);
        o->speculate_value = v;
    } else if (!strcmp(a, "--format")) {
        if (strcmp(v, "text") && strcmp(v, "json"))
            bad_usage("--format: expected text or json, got '%s'", v);
        p->format = !strcmp(v, "json") ? LLMS_FORMAT_JSON_OBJECT : LLMS_FORMAT_TEXT;
    } else if (!strcmp(a, "--schema") || !strcmp(a, "--grammar")) {
        if (o->format_option && strcmp(o->format_option, a))
            bad_usage("--schema and --grammar: give one of them");
        o->format_file = v;
        o->format_option = a;
        o->file_format = !strcmp(a, "--schema") ? LLMS_FORMAT_JSON_SCHEMA : LLMS_FORMAT_GRAMMAR;
    } else if (!strcmp(a, "--mode")) {
        if (strcmp(v, "set") && strcmp(v, "ordered"))
            bad_usage("--mode: expected set or ordered, got '%s'", v);
        o->ro.mode = !strcmp(v, "ordered") ? LLMS_RERANK_ORDERED : LLMS_RERANK_SET;
    } else if (!strcmp(a, "--threshold"))
        o->ro.cv_threshold = (float)number(a, v);
    else if (!strcmp(a, "--precision")) {
        double x = number(a, v);
        if (!(x > 0 && x <= 1))
            bad_usage("--precision: %s is outside (0, 1]", v);
        o->ro.target_precision = (float)x;
    } else if (!strcmp(a, "--socket"))
        o->socket_path = v;
    else if (!strcmp(a, "--app"))
        o->app = v;
    else if (!strcmp(a, "--context"))
        o->context = v;
    else if (!strcmp(a, "--overflow")) {
        if (strcmp(v, "window") && strcmp(v, "refuse"))
            bad_usage("--overflow: expected window or refuse, got '%s'", v);
        o->overflow = !strcmp(v, "refuse") ? LLMS_OVERFLOW_REFUSE : LLMS_OVERFLOW_WINDOW;
    } else if (!strcmp(a, "--system"))
        o->system = v;
    else if (!strcmp(a, "--model"))
        p->model = o->ro.model = v;
    else if (!strcmp(a, "--embed-model"))
        o->embed_model = v;
    else if (!strcmp(a, "-f") || !strcmp(a, "--file"))
        o->file = v;
    else if (!strcmp(a, "--temp")) {
        double t = number(a, v);
        if (t < 0 || t > 100)
            bad_usage("--temp: %s is outside [0, 100]", v);
        p->temperature = (float)t;
    } else if (!strcmp(a, "--max-tokens"))
        p->max_tokens = (int32_t)integer(a, v, 1, MAX_TOKENS_LIMIT);
    else {
        p->seed = (uint64_t)integer(a, v, 0, UINT64_MAX);
        p->has_seed = 1;
    }
}

/* Reads argv into o (o->pos and o->opts have room for argc entries); a wrong option
 * exits through bad_usage. 1: --help or --version, answered. */
static int parse_command_line(int argc, char **argv, cli *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 1;
        }
        if (!strcmp(a, "--version")) {
            printf("llms %s\n", LLMS_VERSION);
            return 1;
        }
        if (a[0] != '-' || !strcmp(a, "-")) {
            o->pos[o->npos++] = argv[i];
            continue;
        }
        /* as getopt's: what follows is arguments, a prompt starting with '-' too */
        if (!strcmp(a, "--")) {
            while (++i < argc)
                o->pos[o->npos++] = argv[i];
            break;
        }
        o->opts[o->nopts++] = a;
        if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--share-uid"))
            o->share_uid = 1;
        else if (!takes_value(a))
            bad_usage("unknown option '%s'", a);
        else if (i + 1 >= argc)
            bad_usage("%s needs a value", a);
        else
            read_option(o, a, argv[++i]);
    }
    return 0;
}

/* Refuses what the command does not take and the options that exclude each other; sets
 * a generation's speculation. */
static void check_options(cli *o)
{
    const char *cmd = o->pos[0];
    for (int i = 0; i < o->nopts; i++) {
        const char *applies = option_commands(o->opts[i]);
        if (applies && !has_word(applies, cmd))
            bad_usage("%s: %s does not apply (only to %s)", cmd, o->opts[i], applies);
    }
    if (o->context && o->system)
        bad_usage("chat: --system sets up a new chat; a --context one has its own");
    if (o->context && o->overflow != LLMS_OVERFLOW_DEFAULT)
        bad_usage("chat: --overflow sets up a new chat; a --context one has its own");
    if (o->context && o->p.model)
        bad_usage("chat: --model sets up a new chat; a --context one has its own");
    const char *sv = o->speculate_value;
    int graph = !strcmp(cmd, "graph");
    if (sv && (graph ? strcmp(sv, "on") && strcmp(sv, "off") : !strcmp(sv, "on")))
        bad_usage("%s: --speculate %s does not apply (graph: on or off; ask, chat, rag: off, "
                  "lookup, draft or both)", cmd, sv);
    if (sv && graph)
        o->graph_spec = !strcmp(sv, "on") ? LLMS_SPECULATE_ON : LLMS_SPECULATE_OFF;
    else if (sv)
        o->p.speculation = !strcmp(sv, "lookup")  ? LLMS_SPECULATION_LOOKUP
                           : !strcmp(sv, "draft") ? LLMS_SPECULATION_DRAFT
                           : !strcmp(sv, "both")  ? LLMS_SPECULATION_BOTH
                                                  : LLMS_SPECULATION_OFF;
    if (o->format_file && o->p.format != LLMS_FORMAT_DEFAULT)
        bad_usage("%s: %s and --format: give one of them", cmd, o->format_option);
}

/* Runs the command on a bound connection. */
static int run_command(llms_conn *c, cli *o, const char *prompt)
{
    const char *cmd = o->pos[0];
    char **args = o->pos + 1;
    int n_args = o->npos - 1;
    if (!strcmp(cmd, "ask"))
        return cmd_ask(c, &o->p, prompt, o->system);
    if (!strcmp(cmd, "chat"))
        return cmd_chat(c, &o->p, o->context, o->system, o->overflow);
    if (!strcmp(cmd, "embed"))
        return cmd_embed(c, o->p.model, args, n_args, o->pooling, o->json);
    if (!strcmp(cmd, "rerank"))
        return cmd_rerank(c, o->query, args, n_args, &o->ro, o->json);
    if (!strcmp(cmd, "kb"))
        return cmd_kb(c, n_args, args, o->share_uid, o->embed_model);
    if (!strcmp(cmd, "rag"))
        return cmd_rag(c, args[0], args[1], o->ro.top_k, o->system, &o->p, o->json,
                       o->share_uid);
    if (!strcmp(cmd, "graph"))
        return cmd_graph(c, n_args, args, &o->p, o->graph_spec, o->json);
    return cmd_ctx(c, n_args, args);
}

int main(int argc, char **argv)
{
    cli o = {.file_format = LLMS_FORMAT_DEFAULT,
             .overflow = LLMS_OVERFLOW_DEFAULT,
             .pooling = LLMS_POOLING_MODEL,
             .graph_spec = LLMS_SPECULATE_DEFAULT};
    llms_rerank_options_init(&o.ro);
    llms_params_init(&o.p);
    o.pos = calloc((size_t)argc + 1, sizeof *o.pos);
    o.opts = calloc((size_t)argc + 1, sizeof *o.opts);
    char *format_owned = NULL, *prompt_owned = NULL;
    const char *prompt = NULL;
    llms_conn *c = NULL;
    char err[LLMS_ERROR_MAX];
    int rc = 1;
    if (!o.pos || !o.opts)
        goto out;
    if (parse_command_line(argc, argv, &o)) {
        rc = 0;
        goto out;
    }
    check_command(o.pos, o.npos, o.query, o.file);
    check_options(&o);
    if (o.format_file) {
        if (!(format_owned = read_file(o.format_file)))
            goto out;
        o.p.format = o.file_format;
        if (o.file_format == LLMS_FORMAT_JSON_SCHEMA)
            o.p.json_schema = format_owned;
        else
            o.p.grammar = format_owned;
    }
    if (!strcmp(o.pos[0], "ask") &&
        !(prompt = ask_prompt(o.npos == 2 ? o.pos[1] : NULL, o.file, &prompt_owned)))
        goto out;
    if (llms_connect(o.socket_path, &c, err) != LLMS_OK) {
        fprintf(stderr, "llms: %s\n", err);
        goto out;
    }
    rc = report(c, llms_bind(c, o.app), "bind");
    if (rc == 0)
        rc = run_command(c, &o, prompt);
    llms_close(c);
    /* Output that could not be written (a full disk, a closed stdout) is a failure, as for
     * any Unix filter: a caller reading the status must not take a lost reply for one. */
    int flushed = fflush(stdout);
    if (flushed != 0 || ferror(stdout)) {
        fprintf(stderr, "llms: writing the output failed%s%s\n", flushed ? ": " : "",
                flushed ? strerror(errno) : "");
        if (rc == 0)
            rc = 1;
    }
out:
    free(prompt_owned);
    free(format_owned);
    free(o.pos);
    free(o.opts);
    return rc;
}
