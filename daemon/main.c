/*
 * main.c — llmsd: settings, model, store, worker, event loop, clean shutdown.
 */
#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/net/connbudget.h"
#include "daemon/net/http.h"
#include "daemon/models/models.h"
#include "daemon/notify.h"
#include "daemon/net/outq.h"
#include "daemon/reqlog.h"
#include "daemon/respload.h"
#include "daemon/sched/sched.h"
#include "daemon/net/server.h"
#include "engine/tok/chat.h"
#include "engine/model/model.h"
#include "engine/tok/tokenizer.h"
#include "storage/store.h"

#define STATUS_SECONDS 5

static void usage(FILE *out)
{
    fprintf(out,
            "usage: llmsd [-c PATH] [--KEY VALUE]...\n"
            "Serves an LLM to the apps of this machine over a Unix socket.\n\n"
            "  -c, --config PATH           settings file (default %s; a missing default\n"
            "                              file is fine, a missing given one is an error)\n"
            "  -h, --help                  this text\n"
            "      --version               the version\n"
            "      --print-settings=FORMAT the settings' documentation, generated from their\n"
            "                              table: markdown (daemon/README.md's table) or conf\n"
            "                              (a sample settings file)\n\n"
            "Every setting of the file can be given as --KEY VALUE (or --KEY=VALUE), which\n"
            "overrides the file:\n",
            CONFIG_DEFAULT_PATH);
    config_print_keys(out);
}

#define PRINT_SETTINGS "--print-settings="

/* Loads the file, then applies the flags. Returns 0, 1 for --help, 2 for --version, 3 for
 * --print-settings (its format in *doc), -1 on error. */
static int parse_args(int argc, char **argv, config *cfg, config_doc *doc, char err[ERR_MAX])
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
        if (strcmp(argv[i], "--version") == 0)
            return 2;
        if (strncmp(argv[i], PRINT_SETTINGS, strlen(PRINT_SETTINGS)) == 0) {
            const char *format = argv[i] + strlen(PRINT_SETTINGS);
            if (strcmp(format, "markdown") == 0)
                *doc = CONFIG_DOC_MARKDOWN;
            else if (strcmp(format, "conf") == 0)
                *doc = CONFIG_DOC_CONF;
            else
                return err_set(err, "--print-settings: '%s' is not markdown or conf", format);
            return 3;
        }
        if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc)
                return err_set(err, "%s needs a path", argv[i]);
            path = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            path = argv[i] + 9;
        }
    }
    if (config_defaults(cfg, err))
        return -1;
    if (path) {
        if (config_load(cfg, path, err))
            return -1;
    } else if (access(CONFIG_DEFAULT_PATH, F_OK) == 0 && config_load(cfg, CONFIG_DEFAULT_PATH, err)) {
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (strncmp(a, "--", 2) != 0)
            return err_set(err, "unexpected argument '%s' (see --help)", a);
        char key[128];
        const char *value;
        const char *eq = strchr(a + 2, '=');
        size_t klen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (klen >= sizeof key)
            return err_set(err, "unknown option '%s'", a);
        memcpy(key, a + 2, klen);
        key[klen] = '\0';
        if (!config_known(key))
            return err_set(err, "unknown option '--%s' (see --help)", key);
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc)
                return err_set(err, "--%s needs a value", key);
            value = argv[++i];
        }
        char e[ERR_MAX];
        if (config_set(cfg, key, value, e))
            return err_set(err, "--%s", e);
    }
    return config_check(cfg, err);
}

typedef struct loop_state {
    server *srv;
    sched *sch;
    struct event *watchdog;
    struct event *status;
    struct event *sigterm, *sigint, *sighup;
    unsigned last_contexts, last_conns;
    bool status_sent;
    http *gw;               /* the HTTP gateway, or NULL */
} loop_state;

/* A stop signal that came while the loop's handlers were not in place: between this
 * handler's install and theirs (acted on once they are), or after they are gone at the
 * end of the teardown (dropped: the daemon is stopping). libevent puts this handler back
 * when the loop's signal events are freed, so a second SIGTERM late in the teardown
 * (timeout(1) and `kill` of a process group send one to the daemon and one to its group;
 * an admin presses Ctrl-C twice) is not SIGTERM's default action killing the daemon
 * before it exits. SIGHUP comes here too: a reload then means nothing. */
static volatile sig_atomic_t stop_outside_loop;

static void on_signal_outside_loop(int sig)
{
    if (sig != SIGHUP)
        stop_outside_loop = sig;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    loop_state *ls = arg;
    fprintf(stderr, "llmsd: signal %d: shutting down\n", (int)sig);
    server_shutdown(ls->srv);
}

/* SIGHUP (systemctl reload): what can change without a restart is read again, the
 * gateway's tokens; a file that does not load leaves those in use. */
static void on_reload(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    loop_state *ls = arg;
    char err[ERR_MAX];
    size_t n;
    notify_reloading();
    if (!ls->gw)
        fprintf(stderr, "llmsd: reload: nothing to read again (no HTTP gateway)\n");
    else if (http_reload_tokens(ls->gw, &n, err))
        fprintf(stderr, "llmsd: reload: %s; the tokens in use stay\n", err);
    else
        fprintf(stderr, "llmsd: reload: %zu HTTP tokens\n", n);
    notify_ready();
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    notify_watchdog();
}

static void on_status(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    loop_state *ls = arg;
    unsigned n_ctx = sched_n_contexts(ls->sch), n_conn = server_n_connections(ls->srv);
    if (ls->status_sent && n_ctx == ls->last_contexts && n_conn == ls->last_conns)
        return;
    notify_status("serving %u contexts, %u connections", n_ctx, n_conn);
    ls->last_contexts = n_ctx;
    ls->last_conns = n_conn;
    ls->status_sent = true;
}

/* Resolves the settings that depend on the model. */
static void resolve(config *cfg, const model_hparams *hp)
{
    if (cfg->n_ctx == 0)
        cfg->n_ctx = hp->n_ctx < 4096 ? hp->n_ctx : 4096;
    /* a window is not computed (model.h): the context stays within it, every answer exact */
    if (hp->sliding_window > 0 && cfg->n_ctx > hp->n_ctx) {
        fprintf(stderr, "llmsd: warning: n_ctx %d capped to the model's sliding window %d\n",
                cfg->n_ctx, hp->n_ctx);
        cfg->n_ctx = hp->n_ctx;
    }
    if (cfg->n_ctx > hp->n_ctx)
        fprintf(stderr, "llmsd: warning: n_ctx %d exceeds the model's trained %d\n", cfg->n_ctx,
                hp->n_ctx);
    if (cfg->max_tokens_per_context == 0 || cfg->max_tokens_per_context > cfg->n_ctx)
        cfg->max_tokens_per_context = cfg->n_ctx;
}

/* The arguments that ask for information instead of a daemon (rc of parse_args: 1 help,
 * 2 version, 3 the settings' documentation) answered: the exit status. */
static int answer_info_args(int rc, config_doc doc)
{
    char err[ERR_MAX];
    if (rc == 1)
        usage(stdout);
    else if (rc == 2)
        printf("llmsd %s\n", LLMS_VERSION);
    else if (config_print_settings(stdout, doc, err)) {
        fprintf(stderr, "llmsd: %s\n", err);
        return 1;
    }
    return 0;
}

/* The signals belong to the loop before the sockets listen: a stop sent as soon as a
 * client can connect (systemd, a test) is a clean shutdown, not SIGTERM's default action
 * killing the daemon mid-start. Also the periodic status line. */
static int install_loop_signals(struct event_base *base, loop_state *ls)
{
    struct sigaction outside = {.sa_handler = on_signal_outside_loop};
    sigemptyset(&outside.sa_mask);
    if (sigaction(SIGTERM, &outside, NULL) || sigaction(SIGINT, &outside, NULL) ||
        sigaction(SIGHUP, &outside, NULL)) {
        fprintf(stderr, "llmsd: sigaction: %s\n", strerror(errno));
        return -1;
    }
    ls->sigterm = evsignal_new(base, SIGTERM, on_signal, ls);
    ls->sigint = evsignal_new(base, SIGINT, on_signal, ls);
    ls->sighup = evsignal_new(base, SIGHUP, on_reload, ls);
    ls->status = event_new(base, -1, EV_PERSIST, on_status, ls);
    struct timeval status_tv = {STATUS_SECONDS, 0};
    if (!ls->sigterm || !ls->sigint || !ls->sighup || !ls->status ||
        evsignal_add(ls->sigterm, NULL) || evsignal_add(ls->sigint, NULL) ||
        evsignal_add(ls->sighup, NULL) || event_add(ls->status, &status_tv)) {
        fprintf(stderr, "llmsd: libevent setup failed\n");
        return -1;
    }
    if (stop_outside_loop)
        event_active(stop_outside_loop == SIGINT ? ls->sigint : ls->sigterm, EV_SIGNAL, 1);
    return 0;
}

/* systemd's watchdog, when the unit sets one: pinged at half its interval. */
static void start_watchdog(struct event_base *base, loop_state *ls)
{
    uint64_t wd = notify_watchdog_usec();
    if (!wd)
        return;
    struct timeval tv = {(time_t)(wd / 2 / 1000000), (suseconds_t)(wd / 2 % 1000000)};
    ls->watchdog = event_new(base, -1, EV_PERSIST, on_watchdog, NULL);
    if (ls->watchdog)
        event_add(ls->watchdog, &tv);
}

/* A line per model to the journal: its file, type and roles, and an embed model's
 * pooling, so that a wrong pooling_type shows before its vectors do. */
static void log_models(const models *reg, const models_entry *gen)
{
    static const char *const pool_names[] = {"none", "mean", "cls", "last", "rank"};
    for (const models_entry *e = models_first(reg); e; e = e->next) {
        int pool = e->m ? model_hparams_of(e->m)->pooling_type : -1;
        fprintf(stderr, "llmsd: model '%s': %s%s%s (%s %s)%s%s%s%s\n", e->name,
                e->base ? e->base->name : e->path, e->base ? " with the adapters " : "",
                e->base ? e->lora_spec : "", e->arch, models_type_name(e->type),
                e == gen ? ", generates (the default)" : e->roles & MODELS_GENERATE ? ", generates" : "",
                e->roles & MODELS_DRAFT ? ", drafts" : "",
                (e->roles & ~e->fallback & MODELS_EMBED) ? ", embeds, pooling " : "",
                !(e->roles & ~e->fallback & MODELS_EMBED) ? ""
                : e->enc                                  ? "as the encoder's file says"
                : pool >= 0                               ? pool_names[pool]
                                                          : "not set in the file");
    }
}

static void free_event(struct event *e)
{
    if (e)
        event_free(e);
}

int main(int argc, char **argv)
{
    static config cfg;
    char err[ERR_MAX];
    config_doc doc = CONFIG_DOC_CONF;
    int rc = parse_args(argc, argv, &cfg, &doc, err);
    if (rc >= 1 && rc <= 3)
        return answer_info_args(rc, doc);
    if (rc) {
        fprintf(stderr, "llmsd: %s\n", err);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* a reload asked while the model loads is not the default action's exit; the loop
     * takes SIGHUP once it runs */
    signal(SIGHUP, SIG_IGN);
    reqlog_set_level(cfg.log_level);

    int status = 1;
    models *reg = NULL;
    const model *m = NULL;
    tokenizer *tok = NULL;
    store *st = NULL;
    outq *out = NULL;
    sched *sch = NULL;
    connbudget *budget = NULL;
    http *gw = NULL;
    struct event_base *base = NULL;
    loop_state ls = {0};

    gguf_load load = strcmp(cfg.model_load, "copy") == 0 ? GGUF_LOAD_COPY : GGUF_LOAD_MAP;
    if (!(reg = models_open(&cfg, load, err))) {
        fprintf(stderr, "llmsd: %s\n", err);
        goto out;
    }
    const models_entry *gen = models_generate(reg);
    m = gen->m;
    if (tok_load(model_gguf(m), &tok, err)) {
        fprintf(stderr, "llmsd: model %s: %s\n", gen->path, err);
        goto out;
    }
    resolve(&cfg, model_hparams_of(m));
    enum chat_family family = gen->family;
    if (!(st = store_open(cfg.state_dir, err)) || !(out = outq_new(err))) {
        fprintf(stderr, "llmsd: %s\n", err);
        goto out;
    }
    sched_env env = {&cfg, reg, m, tok, family, st, out};
    if (!(sch = sched_new(&env, err))) {
        fprintf(stderr, "llmsd: %s\n", err);
        goto out;
    }
    base = event_base_new();
    if (!base) {
        fprintf(stderr, "llmsd: event_base_new failed\n");
        goto out;
    }
    ls.sch = sch;
    /* one budget of connections for both listeners: neither kind of socket lets a uid
     * hold what the other refuses */
    if (!(budget = connbudget_new(&cfg, err)) ||
        !(ls.srv = server_new(base, &cfg, tok, sch, out, budget, err))) {
        fprintf(stderr, "llmsd: %s\n", err);
        goto out;
    }
    if (cfg.http_socket[0] || cfg.http_listen[0]) {
        /* the gateway runs on the loop thread: it reads the registry only through
         * models_view_update, which the worker's loads and unloads keep current */
        gw = http_new(base, &cfg, server_session_env(ls.srv), budget, reg, err);
        if (!gw) {
            fprintf(stderr, "llmsd: %s\n", err);
            goto out;
        }
        server_set_http(ls.srv, gw);
        ls.gw = gw;
        /* before the worker owns the store and before the loop answers a request */
        respload(st, http_respstore(gw), &cfg);
    }
    if (install_loop_signals(base, &ls))
        goto out;
    if (server_listen(ls.srv, err) || sched_start(sch, err)) {
        fprintf(stderr, "llmsd: %s\n", err);
        goto out;
    }
    start_watchdog(base, &ls);
    log_models(reg, gen);
    fprintf(stderr, "llmsd: model %s (%s template), n_ctx %d, %u contexts, listening on %s\n",
            gen->path, chat_family_name(family), cfg.n_ctx, sched_n_contexts(sch), cfg.socket);
    notify_ready();
    on_status(-1, 0, &ls);
    event_base_dispatch(base);
    status = 0;
out:
    /* The gateway goes first: what it still holds is closed towards the worker. The
     * worker has persisted everything and exited (or sched_free waits for it). */
    http_free(gw);
    sched_free(sch);
    server_free(ls.srv);
    connbudget_free(budget);
    free_event(ls.watchdog);
    free_event(ls.status);
    free_event(ls.sigterm);
    free_event(ls.sigint);
    free_event(ls.sighup);
    if (base)
        event_base_free(base);
    outq_free(out);
    store_close(st);
    tok_free(tok);
    models_free(reg);
    if (status == 0)
        fprintf(stderr, "llmsd: stopped\n");
    return status;
}
