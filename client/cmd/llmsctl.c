/*
 * llmsctl — the administrator's command line client of llmsd (root or group llms-admin).
 *
 *   llmsctl [--socket PATH] [--json] status | apps | contexts | show CTX | evict CTX | profile
 *           | shutdown | plan --prompt-tokens N [--model M]
 *   llmsctl [--socket PATH] [--json] rerank-calibrate --precision P [-k K]
 *           [--mode set|ordered] SETFILE...
 *   llmsctl --help | --version
 *
 * A calibration set file holds queries with their candidate documents, one per line:
 * "Q: text" starts a query, each following "D: text" is one of its documents (one space
 * after the colon is optional and dropped); blank lines and lines starting with '#' are
 * ignored; a query needs at least one document.
 *
 * With --json each command prints exactly one JSON object on stdout (also for errors:
 * {"error": {"code": ..., "message": ...}}).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/tok/utf8.h"

static int json;
static long plan_tokens = -1; /* plan --prompt-tokens */
static const char *plan_model;
static llms_cache_owner cache_owner; /* cache: --all, or --uid U [--app A] */
static int cache_named;

static void usage(void)
{
    printf("usage: llmsctl [--socket PATH] [--json] COMMAND\n"
           "       llmsctl --help | --version\n"
           "\n"
           "commands:\n"
           "  status           the daemon: model, memory, contexts, scheduler\n"
           "  apps             every app with its contexts, queue and connections\n"
           "  contexts         every context of every app\n"
           "  show CTX         one context of any app: chunk map and history\n"
           "  evict CTX        drop a context's KV from memory (it stays stored)\n"
           "  rm CTX           delete a context of any app, its history and KV (a\n"
           "                   damaged one too: llmsctl contexts shows which)\n"
           "  profile          measure the switch-in cost models again\n"
           "  cache --all | --uid U [--app A]  [clear]\n"
           "                   the RAG caches (QA bank, QKV tree) of every owner, of uid U's\n"
           "                   apps, or of app A of uid U (with what U shares): sizes,\n"
           "                   entries; the daemon's hit rates and idle-time prediction;\n"
           "                   clear empties those caches\n"
           "  cache tau X      set tau_query until the daemon restarts\n"
           "  shutdown         stop the daemon cleanly (every context is kept)\n"
           "  plan --prompt-tokens N [--model M]\n"
           "                   the prefill memory plan of an N-token prompt under the\n"
           "                   daemon's prefill_budget_mb, step by step\n"
           "  rerank-calibrate --precision P [-k K] [--mode set|ordered] SETFILE...\n"
           "                   find and store the reranker's pruning threshold for P\n"
           "  models           the model registry: name, arch, type, size, roles, memory\n"
           "  load NAME PATH [ROLES]\n"
           "                   map a GGUF file as model NAME (ROLES: generate, embed,\n"
           "                   rerank, comma-separated; default by the file's kind: an\n"
           "                   encoder embeds, a decoder or a cross-encoder reranks)\n"
           "  load-lora NAME BASE ADAPTER.gguf[:SCALE]...\n"
           "                   an adapter model NAME: the generate model BASE's weights\n"
           "                   with LoRA adapters (llama.cpp's format), each at its scale\n"
           "                   (default 1), as an llmsd.conf lora.NAME line\n"
           "  unload NAME      forget a model (refused while requests use it)\n"
           "\n"
           "options: --socket PATH  daemon socket (default $LLMS_SOCKET or %s)\n"
           "         --json         one JSON object on stdout (errors too)\n"
           "Admin calls need root or the group llms-admin.\n",
           LLMS_DEFAULT_SOCKET);
}

/* A mistake on the command line: what is wrong, and where help is. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("llmsctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(llmsctl --help lists the commands)\n", stderr);
    exit(2);
}

/* JSON strings go through one writer that also replaces invalid UTF-8: histories hold
 * whatever bytes users sent. */
static void json_str(const char *s)
{
    utf8_json_string(stdout, s);
}

/* One context as a JSON object; with_history adds its messages. */
static void json_context(const llms_context_info *c, int with_history)
{
    fputs("{\"context_id\":", stdout);
    json_str(c->id);
    fputs(",\"app_name\":", stdout);
    json_str(c->app_name);
    if (c->has_uid)
        printf(",\"uid\":%" PRIu32, c->uid);
    printf(",\"n_tokens\":%" PRIu32 ",\"created_unix_ms\":%" PRIu64
           ",\"last_used_unix_ms\":%" PRIu64 ",\"memory\":\"%s\",\"kv_bytes\":%" PRIu64,
           c->n_tokens, c->created_unix_ms, c->last_used_unix_ms, llms_memory_name(c->memory),
           c->kv_bytes);
    printf(",\"overflow\":\"%s\",\"window_slides\":%" PRIu64 ",\"window_dropped_tokens\":%" PRIu64,
           llms_overflow_name(c->overflow), c->window_slides, c->window_dropped_tokens);
    fputs(",\"system_prompt\":", stdout);
    json_str(c->system_prompt);
    if (c->model) {
        fputs(",\"model\":", stdout);
        json_str(c->model);
    }
    if (c->damage) {
        fputs(",\"damage\":", stdout);
        json_str(c->damage);
    }
    if (c->n_chunks) {
        fputs(",\"chunks\":[", stdout);
        for (size_t i = 0; i < c->n_chunks; i++) {
            const llms_chunk_info *k = &c->chunks[i];
            printf("%s{\"index\":%" PRIu32 ",\"n_tokens\":%" PRIu32 ",\"resident\":%s"
                   ",\"on_disk\":%s,\"bits\":%" PRIu32 ",\"density\":%.6g}",
                   i ? "," : "", k->index, k->n_tokens, k->resident ? "true" : "false",
                   k->on_disk ? "true" : "false", k->bits, (double)k->density);
        }
        putchar(']');
    }
    if (with_history) {
        fputs(",\"history\":[", stdout);
        for (size_t i = 0; i < c->n_history; i++) {
            fputs(i ? ",{\"role\":" : "{\"role\":", stdout);
            json_str(c->history[i].role);
            fputs(",\"content\":", stdout);
            json_str(c->history[i].content);
            putchar('}');
        }
        putchar(']');
    }
    putchar('}');
}

static void text_context(const llms_context_info *c)
{
    printf("%s  uid %-6" PRIu32 " %-20s %6" PRIu32 " tokens  %-8s  kv %" PRIu64 " bytes\n",
           c->id, c->uid, c->app_name ? c->app_name : "?", c->n_tokens,
           llms_memory_name(c->memory), c->kv_bytes);
    if (c->damage)
        printf("  DAMAGED (its calls fail; `llms --app APP ctx rm ID` clears it): %s\n",
               c->damage);
}

static void json_cost(const llms_cost_models *m)
{
    printf("{\"rec_a_ms\":%.6g,\"rec_b_ms_per_token\":%.6g,\"rec_c_ms_per_token_ctx\":%.6g"
           ",\"io_d_ms\":%.6g,\"io_e_ms_per_byte\":%.6g,\"warm_d_ms\":%.6g"
           ",\"warm_e_ms_per_byte\":%.6g,\"io_f_ms_per_file\":%.6g"
           ",\"warm_f_ms_per_file\":%.6g,\"rec_resid\":%.4f,\"io_resid\":%.4f"
           ",\"warm_resid\":%.4f,\"samples\":%" PRIu32 ",\"rec_fix\":%.4f,\"cold_fix\":%.4f"
           ",\"warm_fix\":%.4f,\"rec_contention\":%.4f,\"read_contention\":%.4f"
           ",\"observed\":%" PRIu64 ",\"rec_ratio_median\":%.4f,\"rec_ratio_last\":%.4f"
           ",\"read_ratio_median\":%.4f,\"read_ratio_last\":%.4f"
           ",\"total_ratio_median\":%.4f,\"total_ratio_last\":%.4f}",
           m->rec_a, m->rec_b, m->rec_c, m->io_d, m->io_e, m->warm_d, m->warm_e, m->io_f,
           m->warm_f, m->rec_resid,
           m->io_resid, m->warm_resid, m->samples, m->rec_fix, m->cold_fix, m->warm_fix,
           m->rec_contention, m->read_contention, m->observed, m->rec_ratio_median,
           m->rec_ratio_last, m->read_ratio_median, m->read_ratio_last, m->total_ratio_median,
           m->total_ratio_last);
}

static double mb_per_s(double ms_per_byte)
{
    return ms_per_byte > 0 ? 1e-3 / ms_per_byte : 0;
}

/* The fitted lines and their quality (label: the first column of the first line). */
static void text_cost_lines(const char *label, const llms_cost_models *m)
{
    printf("%-18srecompute %.3f + %.4f t + %.3g t n ms (fit within %.0f%%, %" PRIu32
           " runs per point%s)\n"
           "                  read cold %.3f + %.3f f + %.3g b ms (%.0f MB/s, fit within %.0f%%)"
           "; warm %.3f + %.3f f + %.3g b ms (%.0f MB/s, fit within %.0f%%)\n",
           label, m->rec_a, m->rec_b, m->rec_c, 100 * m->rec_resid, m->samples,
           m->samples ? "" : ": not measured", m->io_d, m->io_f, m->io_e, mb_per_s(m->io_e),
           100 * m->io_resid, m->warm_d, m->warm_f, m->warm_e, mb_per_s(m->warm_e),
           100 * m->warm_resid);
}

/* One draft source's speculative decoding counters, as JSON. */
static void json_spec_counts(const char *source, uint64_t steps, uint64_t proposed,
                             uint64_t accepted)
{
    printf("\"%s\":{\"proposals\":%" PRIu64 ",\"drafts\":%" PRIu64 ",\"accepted\":%" PRIu64
           ",\"mean_accepted\":%.3f}",
           source, steps, proposed, accepted, steps ? (double)accepted / (double)steps : 0.0);
}

/* One draft source's speculative decoding counters, as a line. */
static void print_spec_counts(const char *source, uint64_t steps, uint64_t proposed,
                              uint64_t accepted)
{
    printf("speculation %-7s%" PRIu64 " proposals, %" PRIu64 " drafts, %" PRIu64
           " accepted (%.1f%%), %.2f accepted a proposal\n",
           source, steps, proposed, accepted,
           proposed ? 100.0 * (double)accepted / (double)proposed : 0.0,
           steps ? (double)accepted / (double)steps : 0.0);
}

/* The daemon's status as one JSON object on a line. */
static void print_status_json(const llms_daemon_status *st)
{
    fputs("{\"version\":", stdout);
    json_str(st->version);
    fputs(",\"model_path\":", stdout);
    json_str(st->model_path);
    fputs(",\"model_arch\":", stdout);
    json_str(st->model_arch);
    printf(",\"model_bytes\":%" PRIu64 ",\"n_ctx\":%" PRIu32 ",\"threads\":%" PRIu32
           ",\"uptime_ms\":%" PRIu64 ",\"n_connections\":%" PRIu32 ",\"n_apps\":%" PRIu32
           ",\"n_contexts\":%" PRIu32 ",\"n_resident_contexts\":%" PRIu32
           ",\"kv_bytes_resident\":%" PRIu64 ",\"queued_requests\":%" PRIu32
           ",\"running_requests\":%" PRIu32 ",\"rss_bytes\":%" PRIu64,
           st->model_bytes, st->n_ctx, st->threads, st->uptime_ms, st->n_connections,
           st->n_apps, st->n_contexts, st->n_resident_contexts, st->kv_bytes_resident,
           st->queued_requests, st->running_requests, st->rss_bytes);
    printf(",\"damaged_contexts\":%" PRIu32, st->damaged_contexts);
    printf(",\"prompt_cache\":{\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
           ",\"reused_tokens\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"entries\":%" PRIu32 "}",
           st->prompt_cache_hits, st->prompt_cache_misses, st->prompt_cache_reused_tokens,
           st->prompt_cache_bytes, st->prompt_cache_entries);
    printf(",\"kv_budget_bytes\":%" PRIu64 ",\"swap_bytes_written\":%" PRIu64
           ",\"swap_bytes_read\":%" PRIu64 ",\"swap_chunks_written\":%" PRIu64
           ",\"swap_chunks_read\":%" PRIu64 ",\"swap_chunks_recomputed\":%" PRIu64
           ",\"swap_faults\":%" PRIu64 ",\"swap_bad_blobs\":%" PRIu64
           ",\"swap_stale_blobs\":%" PRIu64
           ",\"switch_ins\":%" PRIu64 ",\"switch_in_mean_ms\":%.3f"
           ",\"swap_writes_pending\":%" PRIu32 ",\"swap_write_waits\":%" PRIu64
           ",\"swap_write_wait_ms\":%.3f,\"swap_write_failures\":%" PRIu64
           ",\"kv_f16_bytes\":%" PRIu64 ",\"kv_int8_bytes\":%" PRIu64
           ",\"kv_int4_bytes\":%" PRIu64 ",\"kv_int2_bytes\":%" PRIu64
           ",\"kv_spare_bytes\":%" PRIu64,
           st->kv_budget_bytes, st->swap_bytes_written, st->swap_bytes_read,
           st->swap_chunks_written, st->swap_chunks_read, st->swap_chunks_recomputed,
           st->swap_faults, st->swap_bad_blobs, st->swap_stale_blobs, st->switch_ins,
           st->switch_in_mean_ms, st->swap_writes_pending, st->swap_write_waits,
           st->swap_write_wait_ms,
           st->swap_write_failures, st->kv_f16_bytes, st->kv_int8_bytes, st->kv_int4_bytes,
           st->kv_int2_bytes, st->kv_spare_bytes);
    printf(",\"window_slides\":%" PRIu64 ",\"window_dropped_tokens\":%" PRIu64
           ",\"swap_chunks_promoted\":%" PRIu64,
           st->window_slides, st->window_dropped_tokens, st->swap_chunks_promoted);
    printf(",\"kv_calibration\":{\"calibrated_models\":%" PRIu32
           ",\"forwards_left\":%" PRIu32 ",\"measured\":%" PRIu64 "}",
           st->kv_calibrated_models, st->kv_calib_forwards_left, st->kv_calibrations);
    printf(",\"kb_ivf\":{\"searches\":%" PRIu64 ",\"hinted\":%" PRIu64
           ",\"lists_scanned\":%" PRIu64 ",\"lists_skipped\":%" PRIu64
           ",\"hot_bytes\":%" PRIu64 ",\"trained\":%" PRIu64 ",\"train_pending\":%"
           PRIu32 "}",
           st->kb_ivf_searches, st->kb_ivf_hinted_searches, st->kb_ivf_lists_scanned,
           st->kb_ivf_lists_skipped, st->kb_ivf_hot_bytes, st->kb_ivf_trained,
           st->kb_ivf_train_pending);
    printf(",\"qkv_verify_misses\":%" PRIu64, st->qkv_verify_misses);
    printf(",\"kb_disk\":{\"passages\":%" PRIu64 ",\"text_bytes\":%" PRIu64,
           st->kb_passages, st->kb_text_bytes);
    if (st->kb_disk_measured)
        printf(",\"disk_bytes\":%" PRIu64, st->kb_disk_bytes);
    fputs("}", stdout);
    fputs(",\"cost\":", stdout);
    json_cost(&st->cost);
    fputs(",\"sched\":{\"mode\":", stdout);
    json_str(st->sched_mode);
    printf(",\"step_tokens\":%" PRIu32 ",\"active_sequences\":%" PRIu32
           ",\"queued_generate\":%" PRIu32 ",\"queued_embed\":%" PRIu32
           ",\"queued_rerank\":%" PRIu32 ",\"steps\":%" PRIu64
           ",\"step_mean_ms\":%.3f,\"rows_per_step\":%.2f,\"longest_stall_ms\":%.3f}",
           st->sched_step_tokens, st->sched_active_sequences, st->sched_queued_generate,
           st->sched_queued_embed, st->sched_queued_rerank, st->sched_steps,
           st->sched_step_mean_ms, st->sched_rows_per_step, st->sched_longest_stall_ms);
    printf(",\"models_resident_bytes\":%" PRIu64 ",\"models_scratch_bytes\":%" PRIu64,
           st->models_resident_bytes, st->models_scratch_bytes);
    printf(",\"graph_speculation\":{\"started\":%" PRIu64 ",\"hits\":%" PRIu64
           ",\"rollbacks\":%" PRIu64 ",\"saved_ms\":%.3f}",
           st->graph_speculations, st->graph_spec_hits, st->graph_spec_rollbacks,
           st->graph_spec_saved_ms);
    printf(",\"speculative_decoding\":{");
    json_spec_counts("lookup", st->spec_lookup_steps, st->spec_lookup_proposed,
                     st->spec_lookup_accepted);
    fputs(",", stdout);
    json_spec_counts("draft", st->spec_draft_steps, st->spec_draft_proposed,
                     st->spec_draft_accepted);
    fputs("}}\n", stdout);
}

/* The daemon's status as aligned lines of text. */
static void print_status_text(const llms_daemon_status *st)
{
    printf("version           %s\nmodel             %s (%s, %" PRIu64 " bytes)\n"
           "n_ctx             %" PRIu32 "\nthreads           %" PRIu32
           "\nuptime            %.1f s\nconnections       %" PRIu32
           "\napps bound        %" PRIu32 "\ncontexts          %" PRIu32
           " (%" PRIu32 " resident, %" PRIu64 " KV bytes)\n"
           "requests          %" PRIu32 " running, %" PRIu32 " queued\n"
           "rss               %" PRIu64 " bytes\n",
           st->version, st->model_path, st->model_arch, st->model_bytes, st->n_ctx, st->threads,
           (double)st->uptime_ms / 1000.0, st->n_connections, st->n_apps, st->n_contexts,
           st->n_resident_contexts, st->kv_bytes_resident, st->running_requests,
           st->queued_requests, st->rss_bytes);
    if (st->damaged_contexts)
        printf("damaged contexts  %" PRIu32 " (their calls fail; `llmsctl contexts` lists "
               "them, the log says why)\n", st->damaged_contexts);
    printf("prompt cache      %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
           " tokens not evaluated again; %" PRIu32 " prompts kept in %" PRIu64 " bytes\n",
           st->prompt_cache_hits, st->prompt_cache_misses, st->prompt_cache_reused_tokens,
           st->prompt_cache_entries, st->prompt_cache_bytes);
    printf("kv resident       f16 %" PRIu64 ", int8 %" PRIu64 ", int4 %" PRIu64
           ", int2 %" PRIu64 " bytes; %" PRIu64 " spare\n",
           st->kv_f16_bytes, st->kv_int8_bytes, st->kv_int4_bytes, st->kv_int2_bytes,
           st->kv_spare_bytes);
    printf("kv budget         %" PRIu64 " bytes%s (resident + spare)\n"
           "swap              %" PRIu64 " chunks (%" PRIu64 " bytes) written, %" PRIu64
           " read (%" PRIu64 " bytes), %" PRIu64 " recomputed, %" PRIu64 " promoted\n"
           "swap-out thread   %" PRIu32 " batches pending; waited for %" PRIu64
           " times (%.1f ms); %" PRIu64 " failed\n"
           "switch-ins        %" PRIu64 ", mean %.2f ms; %" PRIu64 " faults, %" PRIu64
           " bad blobs, %" PRIu64 " stale\n",
           st->kv_budget_bytes, st->kv_budget_bytes ? "" : " (no cap)", st->swap_chunks_written,
           st->swap_bytes_written, st->swap_chunks_read, st->swap_bytes_read,
           st->swap_chunks_recomputed, st->swap_chunks_promoted, st->swap_writes_pending,
           st->swap_write_waits, st->swap_write_wait_ms, st->swap_write_failures, st->switch_ins,
           st->switch_in_mean_ms, st->swap_faults, st->swap_bad_blobs, st->swap_stale_blobs);
    printf("window slides     %" PRIu64 " (%" PRIu64 " tokens out of view)\n",
           st->window_slides, st->window_dropped_tokens);
    printf("kv calibration    %" PRIu32 " models calibrated; %" PRIu32
           " forwards waiting for idle time; %" PRIu64 " measured\n",
           st->kv_calibrated_models, st->kv_calib_forwards_left, st->kv_calibrations);
    printf("kb ivf            %" PRIu64 " searches (%" PRIu64 " hinted), %" PRIu64
           " lists scanned, %" PRIu64 " skipped; hot copies %" PRIu64 " bytes; %" PRIu64
           " trained, %s\n",
           st->kb_ivf_searches, st->kb_ivf_hinted_searches, st->kb_ivf_lists_scanned,
           st->kb_ivf_lists_skipped, st->kb_ivf_hot_bytes, st->kb_ivf_trained,
           st->kb_ivf_train_pending ? "training waits for idle time" : "none waiting");
    printf("qkv verify misses %" PRIu64 " (nodes under a query's key that were not its)\n",
           st->qkv_verify_misses);
    printf("kb on disk        %" PRIu64 " passages, %" PRIu64 " bytes of text, ",
           st->kb_passages, st->kb_text_bytes);
    if (st->kb_disk_measured)
        printf("%" PRIu64 " bytes on disk (%.0f a passage, %.2fx the text)\n",
               st->kb_disk_bytes,
               st->kb_passages ? (double)st->kb_disk_bytes / (double)st->kb_passages : 0.0,
               st->kb_text_bytes ? (double)st->kb_disk_bytes / (double)st->kb_text_bytes
                                : 0.0);
    else
        printf("bytes on disk measured in idle time, not yet\n");
    printf("scheduler         %s, %" PRIu32 " rows per step; %" PRIu32
           " sequences active; queued: %" PRIu32 " generate, %" PRIu32 " embed, %" PRIu32
           " rerank\n"
           "steps             %" PRIu64 " (last minute: mean %.2f ms, %.1f rows, "
           "longest stall %.1f ms)\n",
           st->sched_mode, st->sched_step_tokens, st->sched_active_sequences,
           st->sched_queued_generate, st->sched_queued_embed, st->sched_queued_rerank,
           st->sched_steps, st->sched_step_mean_ms, st->sched_rows_per_step,
           st->sched_longest_stall_ms);
    const llms_cost_models *m = &st->cost;
    text_cost_lines("cost models", m);
    printf("                  corrections: recompute x%.2f, read cold x%.2f, warm x%.2f; "
           "when both run: recompute x%.2f, read x%.2f\n"
           "observed          %" PRIu64 " switch-ins; observed / predicted (median, last): "
           "recompute %.2f, %.2f; read %.2f, %.2f; whole %.2f, %.2f\n",
           m->rec_fix, m->cold_fix, m->warm_fix, m->rec_contention, m->read_contention,
           m->observed, m->rec_ratio_median, m->rec_ratio_last, m->read_ratio_median,
           m->read_ratio_last, m->total_ratio_median, m->total_ratio_last);
    printf("models            %" PRIu64 " bytes of weights in memory, %" PRIu64
           " bytes of runner scratch (llmsctl models: each)\n",
           st->models_resident_bytes, st->models_scratch_bytes);
    printf("graph speculation %" PRIu64 " started, %" PRIu64 " hits, %" PRIu64
           " rollbacks; kept work ran %.1f ms ahead\n",
           st->graph_speculations, st->graph_spec_hits, st->graph_spec_rollbacks,
           st->graph_spec_saved_ms);
    print_spec_counts("lookup", st->spec_lookup_steps, st->spec_lookup_proposed,
                      st->spec_lookup_accepted);
    print_spec_counts("draft", st->spec_draft_steps, st->spec_draft_proposed,
                      st->spec_draft_accepted);
}

static enum llms_status cmd_status(llms_conn *c)
{
    llms_daemon_status st;
    enum llms_status s = llms_status_get(c, &st);
    if (s != LLMS_OK)
        return s;
    if (json)
        print_status_json(&st);
    else
        print_status_text(&st);
    llms_daemon_status_free(&st);
    return LLMS_OK;
}

static enum llms_status cmd_models(llms_conn *c)
{
    llms_model_info *ms;
    size_t n;
    enum llms_status s = llms_list_models(c, &ms, &n);
    if (s != LLMS_OK)
        return s;
    if (json)
        fputs("{\"models\":[", stdout);
    else
        printf("%-20s %-8s %-13s %12s  %-22s %-22s %12s %12s %7s %8s %12s %12s\n", "NAME",
               "ARCH", "TYPE", "FILE_BYTES", "ROLES", "DEFAULT_FOR", "RESIDENT", "SCRATCH",
               "RUNNING", "CONTEXTS", "KV", "KV_BUDGET");
    for (size_t i = 0; i < n; i++) {
        const llms_model_info *m = &ms[i];
        if (json) {
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            json_str(m->name);
            fputs(",\"path\":", stdout);
            json_str(m->path);
            fputs(",\"arch\":", stdout);
            json_str(m->arch);
            fputs(",\"type\":", stdout);
            json_str(m->type);
            fputs(",\"roles\":", stdout);
            json_str(m->roles);
            fputs(",\"default_for\":", stdout);
            json_str(m->default_for);
            printf(",\"file_bytes\":%" PRIu64 ",\"resident_bytes\":%" PRIu64
                   ",\"scratch_bytes\":%" PRIu64 ",\"running\":%" PRIu32,
                   m->file_bytes, m->resident_bytes, m->scratch_bytes, m->running);
            if (m->generates)
                printf(",\"contexts\":%" PRIu32 ",\"kv_bytes\":%" PRIu64
                       ",\"kv_budget_bytes\":%" PRIu64,
                       m->contexts, m->kv_bytes, m->kv_budget_bytes);
            fputs("}", stdout);
        } else {
            printf("%-20s %-8s %-13s %12" PRIu64 "  %-22s %-22s %12" PRIu64 " %12" PRIu64
                   " %7" PRIu32,
                   m->name, m->arch, m->type, m->file_bytes, m->roles,
                   m->default_for[0] ? m->default_for : "-", m->resident_bytes,
                   m->scratch_bytes, m->running);
            if (m->generates)
                printf(" %8" PRIu32 " %12" PRIu64 " %12" PRIu64 "\n", m->contexts,
                       m->kv_bytes, m->kv_budget_bytes);
            else
                printf(" %8s %12s %12s\n", "-", "-", "-");
        }
    }
    if (json)
        fputs("]}\n", stdout);
    llms_model_list_free(ms, n);
    return LLMS_OK;
}

static enum llms_status cmd_apps(llms_conn *c)
{
    llms_app_info *apps;
    size_t n;
    enum llms_status s = llms_list_apps(c, &apps, &n);
    if (s != LLMS_OK)
        return s;
    if (json)
        fputs("{\"apps\":[", stdout);
    for (size_t i = 0; i < n; i++) {
        const llms_app_info *a = &apps[i];
        if (json) {
            printf("%s{\"uid\":%" PRIu32 ",\"app_name\":", i ? "," : "", a->uid);
            json_str(a->app_name);
            printf(",\"n_contexts\":%" PRIu32 ",\"queued_requests\":%" PRIu32
                   ",\"n_connections\":%" PRIu32 "}",
                   a->n_contexts, a->queued_requests, a->n_connections);
        } else {
            printf("uid %-6" PRIu32 " %-24s %4" PRIu32 " contexts  %3" PRIu32
                   " queued  %3" PRIu32 " connections\n",
                   a->uid, a->app_name, a->n_contexts, a->queued_requests, a->n_connections);
        }
    }
    if (json)
        fputs("]}\n", stdout);
    llms_app_list_free(apps, n);
    return LLMS_OK;
}

static enum llms_status cmd_contexts(llms_conn *c)
{
    llms_context_info *infos;
    size_t n;
    enum llms_status s = llms_list_all_contexts(c, &infos, &n);
    if (s != LLMS_OK)
        return s;
    if (json)
        fputs("{\"contexts\":[", stdout);
    for (size_t i = 0; i < n; i++) {
        if (json) {
            if (i)
                putchar(',');
            json_context(&infos[i], 0);
        } else {
            text_context(&infos[i]);
        }
    }
    if (json)
        fputs("]}\n", stdout);
    llms_context_list_free(infos, n);
    return LLMS_OK;
}

/* One context of any app with its history. */
static enum llms_status cmd_show(llms_conn *c, const char *id)
{
    llms_context_info info;
    enum llms_status s = llms_admin_context_get(c, id, 1, &info);
    if (s != LLMS_OK)
        return s;
    if (json) {
        json_context(&info, 1);
        putchar('\n');
    } else {
        text_context(&info);
        printf("overflow %s; window slid %" PRIu64 " times, %" PRIu64 " tokens out of view\n",
               llms_overflow_name(info.overflow), info.window_slides, info.window_dropped_tokens);
        if (info.n_chunks) {
            printf("chunks (R resident, D on disk, bits, density):\n");
            for (size_t i = 0; i < info.n_chunks; i++) {
                const llms_chunk_info *k = &info.chunks[i];
                printf("  %4" PRIu32 " %2" PRIu32 " tok  %c%c %2" PRIu32 " bits  %.4f\n",
                       k->index, k->n_tokens, k->resident ? 'R' : '-', k->on_disk ? 'D' : '-',
                       k->bits, (double)k->density);
            }
        }
        if (info.model)
            printf("model: %s\n", info.model);
        if (info.system_prompt)
            printf("system prompt: %s\n", info.system_prompt);
        for (size_t i = 0; i < info.n_history; i++)
            printf("\n[%s]\n%s\n", info.history[i].role, info.history[i].content);
    }
    llms_context_info_free(&info);
    return LLMS_OK;
}

static enum llms_status cmd_profile(llms_conn *c)
{
    llms_profile_result p;
    enum llms_status s = llms_profile(c, &p);
    if (s != LLMS_OK)
        return s;
    if (json) {
        json_cost(&p.models);
        putchar('\n');
    } else {
        text_cost_lines("cost models", &p.models);
    }
    return LLMS_OK;
}

static enum llms_status cmd_plan(llms_conn *c)
{
    llms_plan_result p;
    enum llms_status s = llms_plan(c, (uint32_t)plan_tokens, plan_model, &p);
    if (s != LLMS_OK)
        return s;
    if (json)
        printf("{\"prompt_tokens\":%ld,\"rows\":%" PRIu32 ",\"attn_rows\":%" PRIu32
               ",\"working_bytes\":%" PRIu64 ",\"budget_bytes\":%" PRIu64 "}\n",
               plan_tokens, p.rows, p.attn_rows, p.working_bytes, p.budget_bytes);
    else
        fputs(p.text, stdout);
    free(p.text);
    return LLMS_OK;
}

static enum llms_status cmd_ok(llms_conn *c, enum llms_status s)
{
    (void)c;
    if (s == LLMS_OK)
        puts(json ? "{\"ok\":true}" : "ok");
    return s;
}

/* ---- rerank-calibrate ---- */

typedef struct calib_set {
    llms_rerank_query *q;  /* (n) documents point into docs */
    size_t n, cap;
    char **texts;          /* (n_texts) every query and document, owned */
    size_t n_texts, texts_cap;
} calib_set;

static float calib_precision = NAN;
static uint32_t calib_k;
static enum llms_rerank_mode calib_mode = LLMS_RERANK_SET;
static calib_set calib;

static void oom(void)
{
    fprintf(stderr, "llmsctl: out of memory\n");
    exit(1);
}

static char *keep_text(const char *t)
{
    if (calib.n_texts == calib.texts_cap) {
        calib.texts_cap = calib.texts_cap ? 2 * calib.texts_cap : 64;
        calib.texts = realloc(calib.texts, calib.texts_cap * sizeof *calib.texts);
        if (!calib.texts)
            oom();
    }
    char *d = strdup(t);
    if (!d)
        oom();
    return calib.texts[calib.n_texts++] = d;
}

/* Adds the queries of one set file; exits with a message naming the line when it is
 * malformed. Documents are gathered per query in a fresh array. */
static void load_set(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "llmsctl: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    llms_rerank_query *cur = NULL;
    size_t doc_cap = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        if (len < 2 || (line[0] != 'Q' && line[0] != 'D') || line[1] != ':') {
            fprintf(stderr, "llmsctl: %s:%zu: expected \"Q: query\" or \"D: document\"\n", path,
                    lineno);
            exit(2);
        }
        const char *text = line + 2 + (line[2] == ' ');
        if (line[0] == 'Q') {
            if (cur && cur->n_documents == 0)
                break;
            if (calib.n == calib.cap) {
                calib.cap = calib.cap ? 2 * calib.cap : 16;
                calib.q = realloc(calib.q, calib.cap * sizeof *calib.q);
                if (!calib.q)
                    oom();
            }
            cur = &calib.q[calib.n++];
            *cur = (llms_rerank_query){keep_text(text), NULL, 0};
            doc_cap = 0;
        } else {
            if (!cur) {
                fprintf(stderr, "llmsctl: %s:%zu: a document before any query\n", path, lineno);
                exit(2);
            }
            if (cur->n_documents == doc_cap) {
                doc_cap = doc_cap ? 2 * doc_cap : 16;
                cur->documents = realloc((void *)cur->documents, doc_cap * sizeof(char *));
                if (!cur->documents)
                    oom();
            }
            ((const char **)cur->documents)[cur->n_documents++] = keep_text(text);
        }
    }
    free(line);
    fclose(f);
    if (cur && cur->n_documents == 0) {
        fprintf(stderr, "llmsctl: %s:%zu: query \"%s\" has no documents\n", path, lineno,
                cur->query);
        exit(2);
    }
}

static void free_sets(void)
{
    for (size_t i = 0; i < calib.n; i++)
        free((void *)calib.q[i].documents);
    free(calib.q);
    for (size_t i = 0; i < calib.n_texts; i++)
        free(calib.texts[i]);
    free(calib.texts);
}

static enum llms_status cmd_calibrate(llms_conn *c)
{
    llms_calibration cal;
    enum llms_status s =
        llms_rerank_calibrate(c, calib.q, calib.n, calib_precision, calib_k, calib_mode, &cal);
    if (s != LLMS_OK)
        return s;
    if (json) {
        printf("{\"found\":%s,\"cv_threshold\":%.6g,\"precision\":%.6g,\"full_ms\":%.3f,"
               "\"pruned_ms\":%.3f,\"grid\":[",
               cal.found ? "true" : "false", cal.cv_threshold, cal.precision, cal.full_ms,
               cal.pruned_ms);
        for (size_t i = 0; i < cal.n_grid; i++)
            printf("%s{\"cv_threshold\":%.6g,\"precision\":%.6g}", i ? "," : "", cal.grid[i],
                   cal.grid_precision[i]);
        fputs("]}\n", stdout);
    } else {
        for (size_t i = 0; i < cal.n_grid; i++)
            printf("threshold %-6g precision@K %.4f\n", cal.grid[i], cal.grid_precision[i]);
        if (cal.found)
            printf("stored threshold %g (precision@K %.4f; %.1f ms per query, full forward "
                   "%.1f ms)\n", cal.cv_threshold, cal.precision, cal.pruned_ms, cal.full_ms);
        else
            printf("no threshold reached precision %g: stored 0 (no pruning)\n",
                   calib_precision);
    }
    llms_calibration_free(&cal);
    return LLMS_OK;
}

static enum llms_status cmd_cache(llms_conn *c, char **pos)
{
    if (pos[1] && !strcmp(pos[1], "clear"))
        return cmd_ok(c, llms_cache_clear_of(c, &cache_owner));
    if (pos[1])
        return cmd_ok(c, llms_cache_tune(c, strtof(pos[2], NULL)));
    llms_cache_stats st;
    enum llms_status s = llms_cache_stats_of(c, &cache_owner, &st);
    if (s != LLMS_OK)
        return s;
    double q = st.rag_queries ? (double)st.rag_queries : 1;
    if (json)
        printf("{\"qa_entries\":%u,\"qa_bytes\":%llu,\"qa_budget_bytes\":%llu,"
               "\"qa_evictions\":%llu,\"qkv_nodes\":%u,\"qkv_bytes\":%llu,"
               "\"qkv_budget_bytes\":%llu,\"rag_queries\":%llu,\"qa_hits\":%llu,"
               "\"qkv_hits\":%llu,\"qkv_tokens_reused\":%llu,\"qkv_evictions\":%llu,"
               "\"tau_query\":%g,\"tau_scheduler\":%g,\"predicted\":%llu,"
               "\"predict_prefilled\":%llu,\"predict_decoded\":%llu,"
               "\"predict_preempted\":%llu,\"predict_qa_hits\":%llu,"
               "\"predict_qkv_hits\":%llu,\"predict_generations\":%llu,"
               "\"predict_steps\":%llu,\"predict_ms\":%.1f,\"predict_queued\":%u,"
               "\"predict_converted\":%llu,\"predict_warmed\":%llu,"
               "\"qkv_verify_misses\":%llu,\"predict_resumed\":%llu}\n",
               st.qa_entries, (unsigned long long)st.qa_bytes,
               (unsigned long long)st.qa_budget_bytes, (unsigned long long)st.qa_evictions,
               st.qkv_nodes, (unsigned long long)st.qkv_bytes,
               (unsigned long long)st.qkv_budget_bytes, (unsigned long long)st.rag_queries,
               (unsigned long long)st.qa_hits, (unsigned long long)st.qkv_hits,
               (unsigned long long)st.qkv_tokens_reused, (unsigned long long)st.qkv_evictions,
               st.tau_query, st.tau_scheduler, (unsigned long long)st.predicted,
               (unsigned long long)st.predict_prefilled, (unsigned long long)st.predict_decoded,
               (unsigned long long)st.predict_preempted, (unsigned long long)st.predict_qa_hits,
               (unsigned long long)st.predict_qkv_hits,
               (unsigned long long)st.predict_generations, (unsigned long long)st.predict_steps,
               st.predict_ms, st.predict_queued, (unsigned long long)st.predict_converted,
               (unsigned long long)st.predict_warmed, (unsigned long long)st.qkv_verify_misses,
               (unsigned long long)st.predict_resumed);
    else
        printf("QA bank   %u entries, %.1f of %.1f KiB, %llu evictions; hits %llu of %llu "
               "queries (%.1f%%)\n"
               "QKV tree  %u nodes, %.1f of %.1f MiB; hits %llu (%.1f%%), %llu tokens reused, "
               "%llu evictions\n"
               "tau_query %g, tau_scheduler %g: predicted queries are %s\n"
               "predicted %llu queries (%llu prefilled, %llu decoded, %llu converted), "
               "%llu generations, %u queued, %llu passages warmed; preempted %llu times, "
               "%llu forwards resumed where a job stopped them; %llu steps, %.1f ms\n"
               "hits on predicted entries: QA %llu, QKV %llu\n",
               st.qa_entries, st.qa_bytes / 1024.0, st.qa_budget_bytes / 1024.0,
               (unsigned long long)st.qa_evictions, (unsigned long long)st.qa_hits,
               (unsigned long long)st.rag_queries, 100.0 * st.qa_hits / q, st.qkv_nodes,
               st.qkv_bytes / 1048576.0, st.qkv_budget_bytes / 1048576.0,
               (unsigned long long)st.qkv_hits, 100.0 * st.qkv_hits / q,
               (unsigned long long)st.qkv_tokens_reused, (unsigned long long)st.qkv_evictions,
               st.tau_query, st.tau_scheduler,
               st.tau_query >= st.tau_scheduler ? "prefilled only (QKV)"
                                                : "prefilled and decoded (QA)",
               (unsigned long long)st.predicted, (unsigned long long)st.predict_prefilled,
               (unsigned long long)st.predict_decoded, (unsigned long long)st.predict_converted,
               (unsigned long long)st.predict_generations, st.predict_queued,
               (unsigned long long)st.predict_warmed, (unsigned long long)st.predict_preempted,
               (unsigned long long)st.predict_resumed, (unsigned long long)st.predict_steps,
               st.predict_ms, (unsigned long long)st.predict_qa_hits,
               (unsigned long long)st.predict_qkv_hits);
    return LLMS_OK;
}

/* load-lora NAME BASE ADAPTER...: the adapters joined as a lora.NAME line writes them. */
static enum llms_status cmd_load_lora(llms_conn *c, char **pos)
{
    char adapters[4096];
    size_t n = 0;
    for (int i = 3; pos[i]; i++) {
        int w = snprintf(adapters + n, sizeof adapters - n, "%s%s", n ? " " : "", pos[i]);
        if (w < 0 || (size_t)w >= sizeof adapters - n)
            bad_usage("load-lora: the adapters are longer than %zu bytes", sizeof adapters - 1);
        n += (size_t)w;
    }
    return cmd_ok(c, llms_model_load_lora(c, pos[1], pos[2], adapters));
}

/* Runs a command main has checked. */
static enum llms_status run(llms_conn *c, char **pos)
{
    const char *cmd = pos[0];
    if (!strcmp(cmd, "rerank-calibrate"))
        return cmd_calibrate(c);
    if (!strcmp(cmd, "status"))
        return cmd_status(c);
    if (!strcmp(cmd, "apps"))
        return cmd_apps(c);
    if (!strcmp(cmd, "contexts"))
        return cmd_contexts(c);
    if (!strcmp(cmd, "show"))
        return cmd_show(c, pos[1]);
    if (!strcmp(cmd, "evict"))
        return cmd_ok(c, llms_evict(c, pos[1]));
    if (!strcmp(cmd, "rm"))
        return cmd_ok(c, llms_admin_context_delete(c, pos[1]));
    if (!strcmp(cmd, "profile"))
        return cmd_profile(c);
    if (!strcmp(cmd, "plan"))
        return cmd_plan(c);
    if (!strcmp(cmd, "models"))
        return cmd_models(c);
    if (!strcmp(cmd, "load"))
        return cmd_ok(c, llms_model_load(c, pos[1], pos[2], pos[3]));
    if (!strcmp(cmd, "load-lora"))
        return cmd_load_lora(c, pos);
    if (!strcmp(cmd, "unload"))
        return cmd_ok(c, llms_model_unload(c, pos[1]));
    if (!strcmp(cmd, "cache"))
        return cmd_cache(c, pos);
    return cmd_ok(c, llms_shutdown(c));
}

/* Exits with a message unless the positional arguments make a command. */
static void check_command(char **pos, int npos)
{
    static const char *const alone[] = {"status", "apps", "contexts", "profile", "shutdown",
                                        "models"};
    if (npos == 0)
        bad_usage("no command");
    for (size_t i = 0; i < sizeof alone / sizeof alone[0]; i++)
        if (!strcmp(pos[0], alone[i])) {
            if (npos > 1)
                bad_usage("%s takes no arguments, got '%s'", pos[0], pos[1]);
            return;
        }
    if (!strcmp(pos[0], "show") || !strcmp(pos[0], "evict") || !strcmp(pos[0], "rm")) {
        if (npos != 2)
            bad_usage("%s needs one context id", pos[0]);
        return;
    }
    if (!strcmp(pos[0], "load")) {
        if (npos < 3 || npos > 4)
            bad_usage("load needs NAME PATH [ROLES]");
        return;
    }
    if (!strcmp(pos[0], "load-lora")) {
        if (npos < 4)
            bad_usage("load-lora needs NAME BASE ADAPTER.gguf[:SCALE]...");
        return;
    }
    if (!strcmp(pos[0], "unload")) {
        if (npos != 2)
            bad_usage("unload needs one model name");
        return;
    }
    if (!strcmp(pos[0], "cache")) {
        char *end = NULL;
        if (npos == 3 && !strcmp(pos[1], "tau"))
            strtof(pos[2], &end);
        if (!(npos == 1 || (npos == 2 && !strcmp(pos[1], "clear")) ||
              (npos == 3 && end && end != pos[2] && !*end)))
            bad_usage("cache takes nothing, 'clear' or 'tau X'");
        if (npos == 3 && cache_named)
            bad_usage("cache tau: --all, --uid and --app do not apply");
        if (npos < 3 && (cache_named == 0 || cache_named == 4))
            bad_usage("cache: name the caches: --all, or --uid U [--app A]");
        if (npos < 3 && (cache_named & 1) && cache_named != 1)
            bad_usage("cache: --all or --uid U [--app A], not both");
        return;
    }
    if (cache_named) {
        bad_usage("--all, --uid and --app apply to cache only");
    }
    if (!strcmp(pos[0], "plan")) {
        if (plan_tokens < 0)
            bad_usage("plan needs --prompt-tokens N");
        if (npos > 1)
            bad_usage("plan takes no arguments, got '%s'", pos[1]);
        return;
    }
    if (!strcmp(pos[0], "rerank-calibrate")) {
        if (isnan(calib_precision))
            bad_usage("rerank-calibrate needs --precision P");
        if (npos < 2)
            bad_usage("rerank-calibrate needs at least one SETFILE");
        return;
    }
    bad_usage("unknown command '%s'", pos[0]);
}

/* Sets the option a that takes the value v. */
static void read_option(const char *a, const char *v, const char **socket_path)
{
    char *end;
    if (!strcmp(a, "--socket")) {
        *socket_path = v;
    } else if (!strcmp(a, "--precision")) {
        calib_precision = strtof(v, &end);
        if (*end || end == v || !(calib_precision > 0 && calib_precision <= 1))
            bad_usage("--precision: expected a number in (0, 1], got '%s'", v);
    } else if (!strcmp(a, "--prompt-tokens")) {
        errno = 0;
        plan_tokens = strtol(v, &end, 10);
        if (errno || *end || end == v || plan_tokens < 1 || plan_tokens > INT32_MAX)
            bad_usage("--prompt-tokens: expected an integer from 1 to %d, got '%s'",
                      INT32_MAX, v);
    } else if (!strcmp(a, "--model")) {
        plan_model = v;
    } else if (!strcmp(a, "--uid")) {
        errno = 0;
        long u = strtol(v, &end, 10);
        if (errno || *end || end == v || u < 0 || u > (long)UINT32_MAX)
            bad_usage("--uid: expected a uid (a number), got '%s'", v);
        cache_owner.uid = (uint32_t)u;
        cache_named |= 2;
    } else if (!strcmp(a, "--app")) {
        cache_owner.app = v;
        cache_named |= 4;
    } else if (!strcmp(a, "-k")) {
        errno = 0;
        long k = strtol(v, &end, 10);
        if (errno || *end || end == v || k < 1 || k > INT32_MAX)
            bad_usage("-k: expected an integer from 1 to %d, got '%s'", INT32_MAX, v);
        calib_k = (uint32_t)k;
    } else {
        if (strcmp(v, "set") && strcmp(v, "ordered"))
            bad_usage("--mode: expected set or ordered, got '%s'", v);
        calib_mode = !strcmp(v, "ordered") ? LLMS_RERANK_ORDERED : LLMS_RERANK_SET;
    }
}

/* The exit status of a command that ended with s (err: why, when not LLMS_OK); a failure
 * is told on stderr, and with --json as a JSON error on stdout too. A listing that could
 * not be written (a full disk, a closed stdout) is a failure, as llms's output is. */
static int exit_status(enum llms_status s, const char *err)
{
    int flushed = fflush(stdout);
    if (s == LLMS_OK && (flushed != 0 || ferror(stdout))) {
        fprintf(stderr, "llmsctl: writing the output failed%s%s\n", flushed ? ": " : "",
                flushed ? strerror(errno) : "");
        return 1;
    }
    if (s == LLMS_OK)
        return 0;
    if (json) {
        fputs("{\"error\":{\"code\":", stdout);
        json_str(llms_status_name(s));
        fputs(",\"message\":", stdout);
        json_str(err);
        fputs("}}\n", stdout);
    }
    fprintf(stderr, "llmsctl: %s (%s)\n", err, llms_status_name(s));
    return 1;
}

int main(int argc, char **argv)
{
    const char *socket_path = NULL;
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    int npos = 0;
    if (!pos)
        oom();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int help = !strcmp(a, "-h") || !strcmp(a, "--help"), version = !strcmp(a, "--version");
        if (help || version) {
            if (help)
                usage();
            else
                printf("llmsctl %s\n", LLMS_VERSION);
            free(pos);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (a[0] != '-') {
            pos[npos++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--all")) {
            cache_owner.all = 1;
            cache_named = 1;
            continue;
        }
        if (strcmp(a, "--socket") && strcmp(a, "--precision") && strcmp(a, "-k") &&
            strcmp(a, "--mode") && strcmp(a, "--prompt-tokens") && strcmp(a, "--model") &&
            strcmp(a, "--uid") && strcmp(a, "--app"))
            bad_usage("unknown option '%s'", a);
        if (i + 1 >= argc)
            bad_usage("%s needs a value", a);
        read_option(a, argv[++i], &socket_path);
    }
    check_command(pos, npos);
    int calibrate = !strcmp(pos[0], "rerank-calibrate");
    for (int i = 1; calibrate && i < npos; i++)
        load_set(pos[i]);

    llms_conn *c;
    char err[LLMS_ERROR_MAX];
    enum llms_status s = llms_connect(socket_path, &c, err);
    if (s == LLMS_OK) {
        s = run(c, pos);
        /* Calibration queues engine work, which belongs to an app: the admin tool's. */
        if (s == LLMS_ERR_FAILED_PRECONDITION && llms_bind(c, "llmsctl") == LLMS_OK)
            s = run(c, pos);
        if (s != LLMS_OK)
            snprintf(err, sizeof err, "%s", llms_last_error(c));
        llms_close(c);
    }
    free_sets();
    free(pos);
    return exit_status(s, err);
}
