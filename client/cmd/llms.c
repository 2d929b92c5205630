/*
 * llms — the user's command line client of llmsd.
 *
 *   llms [options] ask "PROMPT"                one-shot answer (nothing is kept)
 *   llms [options] chat [--context ID] [--system TEXT]
 *                                              conversation; lines from stdin
 *   llms [options] ctx list | show ID | rm ID  the app's contexts
 *
 * options: --socket PATH, --app NAME (default llms-cli), --temp T, --max-tokens N,
 *          --seed S
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/llms.h"

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
            "options: --socket PATH  daemon socket (default $LLMS_SOCKET or %s)\n"
            "         --app NAME     app name the contexts belong to (default llms-cli)\n"
            "         --temp T       sampling temperature (0: greedy)\n"
            "         --max-tokens N tokens to generate at most\n"
            "         --seed S       sampling seed\n",
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
        if (strncmp(a, "--", 2) != 0) {
            pos[npos++] = argv[i];
            continue;
        }
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--socket"))
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
                              (!strcmp(pos[1], "show") || !strcmp(pos[1], "rm"))));
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
        return 1;
    }
    int rc = report(c, llms_bind(c, app), "bind");
    if (rc == 0) {
        if (!strcmp(pos[0], "ask"))
            rc = cmd_ask(c, &p, pos[1]);
        else if (!strcmp(pos[0], "chat"))
            rc = cmd_chat(c, &p, context, system);
        else
            rc = cmd_ctx(c, npos - 1, pos + 1);
    }
    llms_close(c);
    free(pos);
    return rc;
}
