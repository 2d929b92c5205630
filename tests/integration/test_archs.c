/*
 * llmsd serves a file of each of the smaller architectures (olmo2, granitemoe with a
 * shared expert, smollm3, exaone, stablelm, mistral3, exaone4 with the 32B's hybrid
 * attention, glm4, chatglm, command-r, cohere2 with a window of 8, starcoder2, phi2,
 * seed_oss, hunyuan-dense, deepseek2 (DeepSeek-V3's routing, its latent cache),
 * ernie4_5-moe, glm4moe, and
 * a qwen3 file renamed qwen3vl as Qwen3-VL's language model): a random-weight model of each (modelgen, 4 layers, F32) on the test data's llama SPM
 * vocabulary; the daemon reports the architecture and
 * llama.cpp's /completion on token ids answers with the ids, log-probabilities and
 * runners-up of the engine's own greedy decode in this process (a prompt of 24, 12 tokens
 * decoded: smollm3's NoPE layer, granitemoe's experts and mistral3's attention temperature
 * (an original context of 8) on the daemon's prefill and decode paths both). Skips without
 * the vocabulary.
 */
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/model_check.h"
#include "tests/support/test.h"

#define N_PROMPT 24
#define N_GEN 12

static char llmsd_path[1024], vocab_path[1024];

static int32_t prompt_id(int i)
{
    return i == 0 ? 1 /* the SPM vocabulary's BOS */ : (int32_t)(100 + (i * 7919) % 31000);
}

/* Starts llmsd on a model of arch (p's other fields), checks that it names the
 * architecture and that its greedy /completion is the engine's. */
/* Serves p's model, or (vision_arch) its copy renamed to that vision conversion's
 * architecture with Qwen3-VL's M-RoPE sections (halved for a head of 32). */
static void serves_as(modelgen_params p, const char *vision_arch)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    if (!vocab_path[0])
        SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data (LLMS_TESTDATA)");
    char err[ERR_MAX], model_path[1024], name[64], http_sock[1100], extra[2000];
    gguf_file *v = gguf_open(vocab_path, err);
    CHECK_MSG(v, "%s", err);
    p.vocab = v;
    snprintf(name, sizeof name, "%s.gguf", p.arch);
    proc_generate_model(model_path, sizeof model_path, name, &p);
    gguf_close(v);
    CHECK(model_path[0]);
    const char *arch = p.arch;
    if (vision_arch) {
        char plain[1024], key[96];
        snprintf(plain, sizeof plain, "%s", model_path);
        proc_fmt(model_path, sizeof model_path, "%s/%s.gguf", test_tmpdir(), vision_arch);
        snprintf(key, sizeof key, "%s.rope.dimension_sections", vision_arch);
        static const int32_t sections[4] = {6, 5, 5, 0};
        gguf_edit e = {.rename = vision_arch, .ints_key = key, .ints = sections, .n_ints = 4};
        CHECK_MSG(gguf_copy_edited(plain, model_path, &e, err) == 0, "%s", err);
        arch = vision_arch;
    }
    int32_t prompt[N_PROMPT], want[N_GEN], second[N_GEN];
    float lp[N_GEN];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = prompt_id(i);
    CHECK(model_check_greedy(model_path, prompt, N_PROMPT, want, lp, second, N_GEN) == 0);

    llmsd_proc d;
    proc_fmt(http_sock, sizeof http_sock, "%s/%s-h.sock", test_tmpdir(), arch);
    struct group *g = getgrgid(getgid());
    proc_fmt(extra, sizeof extra, "kv_compress = none\nadmin_group = %s\nhttp_socket = %s\n",
             g ? g->gr_name : "root", http_sock);
    CHECK_MSG(proc_start(&d, llmsd_path, arch, model_path, extra) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, NULL);
    llms_daemon_status st;
    bool named = c && proc_status(c, &st) == 0;
    if (named) {
        named = st.model_arch && !strcmp(st.model_arch, arch);
        printf("  %s: llmsd reports '%s'\n", arch, st.model_arch ? st.model_arch : "(none)");
        llms_daemon_status_free(&st);
    }
    llms_close(c);

    char body[2048];
    size_t len = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < N_PROMPT; i++)
        len += (size_t)snprintf(body + len, sizeof body - len, "%s%d", i ? "," : "", prompt[i]);
    snprintf(body + len, sizeof body - len,
             "],\"n_predict\":%d,\"temperature\":0,\"return_tokens\":true,\"n_probs\":2}",
             N_GEN);
    int status;
    json_object *o = httpc_post_json(http_sock, "/completion", body, &status);
    json_object *toks = httpc_jget(o, "tokens");
    bool same = status == 200 && toks && json_object_is_type(toks, json_type_array) &&
                json_object_array_length(toks) == N_GEN;
    double dlp = 0;
    for (int k = 0; same && k < N_GEN; k++) {
        char path[64];
        snprintf(path, sizeof path, "completion_probabilities.%d.logprob", k);
        json_object *l = httpc_jget(o, path);
        snprintf(path, sizeof path, "completion_probabilities.%d.top_logprobs.1.id", k);
        json_object *s2 = httpc_jget(o, path);
        same = json_object_get_int(json_object_array_get_idx(toks, (size_t)k)) == want[k] && l &&
               s2 && json_object_get_int(s2) == second[k];
        if (l)
            dlp = fmax(dlp, fabs(json_object_get_double(l) - lp[k]));
    }
    printf("  %s: %s the engine's %d tokens, max |log-probability diff| %.2g\n", arch,
           same ? "llmsd gives" : "llmsd does not give", N_GEN, dlp);
    char reply[512];
    snprintf(reply, sizeof reply, "%.500s", o ? json_object_to_json_string(o) : "(none)");
    json_object_put(o);
    int stopped = proc_stop(&d, SIGTERM);
    CHECK_MSG(named, "%s: llmsd does not name the architecture", arch);
    CHECK_MSG(same && dlp < 1e-3, "%s: %d %s", arch, status, reply);
    CHECK_MSG(stopped == 0, "%s: llmsd did not exit cleanly", arch);
}

static void serves(modelgen_params p)
{
    serves_as(p, NULL);
}

static modelgen_params small(const char *arch)
{
    return (modelgen_params){.arch = arch, .dim = 128, .n_layer = 4, .n_head = 4,
                             .n_head_kv = 4, .n_ff = 256, .n_ctx = 512, .type = QTYPE_F32,
                             .seed = 3, .n_threads = 2};
}

static void serves_olmo2(void)
{
    serves(small("olmo2"));
}

static void serves_granitemoe(void)
{
    modelgen_params p = small("granitemoe");
    p.n_expert = 8, p.n_expert_used = 2, p.n_ff_shexp = 128;
    serves(p);
}

static void serves_smollm3(void)
{
    serves(small("smollm3"));
}

static void serves_exaone(void)
{
    modelgen_params p = small("exaone");
    p.n_head_kv = 2;
    serves(p);
}

static void serves_stablelm(void)
{
    serves(small("stablelm"));
}

static void serves_mistral3(void)
{
    modelgen_params p = small("mistral3");
    p.n_head_kv = 2, p.rope_orig_ctx = 8;
    serves(p);
}

static void serves_exaone4(void)
{
    modelgen_params p = small("exaone4");
    p.sliding_window = 8;
    serves(p);
}

static void serves_glm4(void)
{
    modelgen_params p = small("glm4");
    p.n_head_kv = 2;
    serves(p);
}

static void serves_chatglm(void)
{
    modelgen_params p = small("chatglm");
    p.n_head_kv = 2;
    serves(p);
}

static void serves_command_r(void)
{
    modelgen_params p = small("command-r");
    p.n_head_kv = 2;
    serves(p);
}

static void serves_cohere2(void)
{
    modelgen_params p = small("cohere2");
    p.sliding_window = 8; /* the prompt and the reply reach past it */
    serves(p);
}

static void serves_starcoder2(void)
{
    modelgen_params p = small("starcoder2");
    p.n_head_kv = 2, p.n_ff = 512;
    serves(p);
}

/* Qwen3-VL's language model, a qwen3 file under its name (test_arch_aliases.c) */
static void serves_qwen3vl(void)
{
    serves_as(small("qwen3"), "qwen3vl");
}

static void serves_phi2(void)
{
    modelgen_params p = small("phi2");
    p.n_ff = 512;
    serves(p);
}

static void serves_seed_oss(void)
{
    modelgen_params p = small("seed_oss");
    p.n_head_kv = 2;
    serves(p);
}

static void serves_hunyuan_dense(void)
{
    serves(small("hunyuan-dense"));
}

/* DeepSeek-V3's routing (sigmoid, selection bias, groups) and V2's YaRN, a dense first
 * layer, its latent cache */
static void serves_deepseek2(void)
{
    modelgen_params p = small("deepseek2");
    p.n_head_kv = 1, p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 64;
    p.n_expert_shared = 1, p.n_dense_lead = 1, p.q_lora_rank = 64, p.kv_lora_rank = 64;
    p.qk_nope_dim = 32, p.qk_rope_dim = 16, p.v_head_dim = 32, p.expert_gating = 2;
    p.expert_weights_norm = true, p.expert_weights_scale = 2.5f, p.exp_probs_b = true;
    p.n_expert_groups = 4, p.n_expert_groups_used = 2;
    p.yarn_factor = 4.0f, p.yarn_mscale_all_dim = 0.707f;
    serves(p);
}

/* ERNIE-4.5-21B-A3B's layout: a dense first layer, experts with the selection bias, a
 * shared expert */
static void serves_ernie_moe(void)
{
    modelgen_params p = small("ernie4_5-moe");
    p.n_head_kv = 2, p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 64;
    p.n_ff_shexp = 128, p.n_dense_lead = 1, p.exp_probs_b = true;
    serves(p);
}

/* GLM-4.5's layout: half of each head rotated, a dense first layer, sigmoid routing with
 * the bias, a shared expert, a prediction layer after the model's */
static void serves_glm4moe(void)
{
    modelgen_params p = small("glm4moe");
    p.n_head_kv = 2, p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 64;
    p.n_expert_shared = 1, p.n_dense_lead = 1, p.expert_weights_norm = true;
    p.expert_weights_scale = 2.5f, p.nextn_layers = 1;
    serves(p);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *vocab = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (vocab)
        proc_fmt(vocab_path, sizeof vocab_path, "%s", vocab);
    RUN(serves_olmo2);
    RUN(serves_granitemoe);
    RUN(serves_smollm3);
    RUN(serves_exaone);
    RUN(serves_stablelm);
    RUN(serves_mistral3);
    RUN(serves_exaone4);
    RUN(serves_glm4);
    RUN(serves_chatglm);
    RUN(serves_command_r);
    RUN(serves_cohere2);
    RUN(serves_starcoder2);
    RUN(serves_qwen3vl);
    RUN(serves_phi2);
    RUN(serves_seed_oss);
    RUN(serves_hunyuan_dense);
    RUN(serves_deepseek2);
    RUN(serves_ernie_moe);
    RUN(serves_glm4moe);
    return test_finish();
}
