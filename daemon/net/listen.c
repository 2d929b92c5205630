/*
 * listen.c — a listening Unix socket at a path: its directory made, a stale socket file
 * replaced, its permission bits set; and a listener's rest when accept() fails. Both
 * listeners open theirs here.
 */
#include "daemon/net/listen.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/config.h"

static int make_dirs(const char *path, char err[ERR_MAX])
{
    char dir[CONFIG_SOCKET_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return err_set(err, "socket directory %s: %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return err_set(err, "socket directory %s: %s", dir, strerror(errno));
    return 0;
}

int listen_unix(const char *path, unsigned mode, char err[ERR_MAX])
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return err_set(err, "socket: path longer than %zu bytes", sizeof addr.sun_path - 1);
    strcpy(addr.sun_path, path);
    if (make_dirs(path, err))
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_set(err, "socket: %s", strerror(errno));
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            close(fd);
            return err_set(err, "socket: %s exists and is not a socket", path);
        }
        /* A socket file nobody answers on is stale; one that answers is another llmsd. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof addr) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            close(fd);
            return err_set(err, "socket: %s is in use by a running daemon", path);
        }
        unlink(path);
    }
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        chmod(path, mode) != 0 || listen(fd, 128) != 0) {
        err_set(err, "socket %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

void listen_rest(struct evconnlistener *l, struct event *resume, int ms, ratelog *log,
                 const char *what, unsigned n_open)
{
    int e = EVUTIL_SOCKET_ERROR();
    ratelog_warn(log, "%s: %s; not accepting for %d ms (%u connections open)", what,
                 strerror(e), ms, n_open);
    evconnlistener_disable(l);
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(resume, &tv);
}
