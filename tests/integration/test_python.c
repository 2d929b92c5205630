/*
 * The Python client (python/llmsclient, ctypes over this build's libllmsclient.so)
 * against a real llmsd of this build: runs python/tests/test_llmsclient.py with
 * Debian's python3, telling it the daemon's socket, this build's library and its llms
 * (LLMS_SOCKET, LLMS_CLIENT_LIB, LLMS_CLI). Skips with a message when python3 is missing. In a sanitizer build
 * the library needs the ASan runtime loaded first, so it is preloaded (leak checks off:
 * the interpreter itself never frees everything).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define PYTHON "/usr/bin/python3"
#define SUITE "python/tests/test_llmsclient.py"

static char llmsd_path[1024], model_path[1024], lib_path[1100], cli_path[1100];

static void python_client(void)
{
    if (access(PYTHON, X_OK) != 0)
        SKIP("%s is not installed (scripts/install-deps.sh installs python3)", PYTHON);
    if (!llmsd_path[0] || !model_path[0])
        SKIP("llmsd or its model is missing");
    if (access(SUITE, R_OK) != 0)
        SKIP("%s is not here (run from the source tree)", SUITE);
    CHECK_MSG(access(lib_path, R_OK) == 0, "%s is not built", lib_path);
    llmsd_proc d;
    /* The generated vocabulary has no "yes"/"no": any two ids do for a rerank. Frames
     * of 1 MiB: a KbAdd long enough to be cancelled while it runs. */
    CHECK(proc_start(&d, llmsd_path, "python", model_path,
                     "rerank_yes_token = 10\nrerank_no_token = 11\n"
                     "max_frame_bytes = 1048576\n") == 0);
    char preload[1024] = "", cmd[4096], out[1 << 15];
    proc_fmt(cmd, sizeof cmd, "ldd '%s' | awk '/libasan|libtsan/ {print $3}'", lib_path);
    if (test_run_capture(cmd, preload, sizeof preload) == 0 && preload[0]) {
        preload[strcspn(preload, "\n")] = '\0';
        char tmp[1100];
        proc_fmt(tmp, sizeof tmp, "LD_PRELOAD='%s' ASAN_OPTIONS=detect_leaks=0", preload);
        proc_fmt(preload, sizeof preload, "%s", tmp);
    }
    proc_fmt(cmd, sizeof cmd,
             "%s LLMS_SOCKET='%s' LLMS_CLIENT_LIB='%s' LLMS_CLI='%s' timeout 300 %s %s 2>&1",
             preload, d.sock, lib_path, cli_path, PYTHON, SUITE);
    int rc = test_run_capture(cmd, out, sizeof out);
    fputs(out, stdout);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    CHECK_MSG(rc == 0, "the Python client tests failed (status %d)", rc);
    CHECK(strstr(out, "\nOK"));
}

int main(int argc, char **argv)
{
    (void)argc;
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (llmsd_path[0]) { /* BUILD/tests/integration/../../llmsd: the library and llms are
                            beside it */
        int dir = (int)(strlen(llmsd_path) - 5);
        proc_fmt(lib_path, sizeof lib_path, "%.*slibllmsclient.so", dir, llmsd_path);
        proc_fmt(cli_path, sizeof cli_path, "%.*sllms", dir, llmsd_path);
    }
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 11, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "python.gguf", &mp);
    RUN(python_client);
    return test_finish();
}
