/* libFuzzer target for the HTTP gateway's reading of OpenAI request bodies: any bytes
 * that parse as JSON go through the sampling fields (read_params, read_logit_bias,
 * refuse_unhonoured), a chat's tools (toolcall_read) and messages rendered with a
 * template family (openai_render_chat, jsonfield_message_content) with its
 * chat_template_kwargs and reasoning_format (openai_read_thinking), the prompt scanned
 * for tool calls and split into reasoning and content as if it were a reply
 * (toolcall_scan_feed, openai_split_whole), and the last message read as a context's
 * turn (context_turn), as daemon/net/openai.c does for a client on its TCP port;
 * then read as a Responses body (responses_chat_body), and the chat made of it read the
 * same way. openai.c's functions are static, so this file includes openai.c itself; a
 * refusal must come with a message, and nothing may crash or leak. */
#include "daemon/net/openai.c" /* IWYU pragma: keep */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* body (an object) read as /v1/chat/completions reads it, for a model of family. */
static void read_chat(json_object *body, enum chat_family family)
{
    char msg[256] = "";
    const char *stops[STOP_MAX];
    Llms__GenerationParams gp = LLMS__GENERATION_PARAMS__INIT;
    llamaparams_lists lists;
    gp.stop = (char **)stops;
    if (read_params(body, &gp, STOP_MAX - 1, &lists, msg, sizeof msg) < 0 && !msg[0])
        abort();
    for (size_t i = 0; i < gp.n_stop; i++)
        if (!stops[i])
            abort();
    static config cfg = {.reasoning_format = "auto"};
    static http h = {.cfg = &cfg};
    hreq hr = {.body = body, .h = &h};
    msg[0] = '\0';
    if (read_logit_bias(&hr, &gp, msg, sizeof msg) < 0 && !msg[0])
        abort();
    for (size_t i = 0; i < gp.n_logit_bias; i++)
        if (gp.logit_bias[i]->token < 0)
            abort();
    free(hr.bias);
    free(hr.bias_ptrs);
    msg[0] = '\0';
    if (refuse_unhonoured(body, true, msg, sizeof msg) < 0 && !msg[0])
        abort();
    hr.family = family;
    msg[0] = '\0';
    if (openai_read_thinking(&hr, msg, sizeof msg) < 0 && !msg[0])
        abort();
    msg[0] = '\0';
    if (toolcall_read(body, family, &hr.tools, msg, sizeof msg) < 0) {
        /* refused: the gateway answers with msg and renders nothing */
        if (!msg[0])
            abort();
        toolcall_set_free(&hr.tools);
        return;
    }
    json_object *msgs;
    msg[0] = '\0';
    if (jsonfield_get(body, "messages", "", json_type_array, &msgs, msg, sizeof msg) == 1 &&
        json_object_array_length(msgs) > 0) {
        char *prompt = openai_render_chat(&hr, msgs, msg, sizeof msg);
        if (!prompt && !msg[0])
            abort();
        toolcall_out out;
        if (prompt && hr.scan && toolcall_scan_feed(hr.scan, prompt, strlen(prompt), true, &out) == 0)
            toolcall_out_free(&out);
        reasoning_span r, c;
        if (prompt)
            openai_split_whole(&hr, prompt, &r, &c);
        if (prompt && (r.n + c.n > strlen(prompt) || (!hr.reasoning && r.n)))
            abort();
        free(prompt);
        msg[0] = '\0';
        char *turn = NULL;
        if (context_turn(msgs, &turn, msg, sizeof msg) < 0 && !msg[0])
            abort();
        free(turn);
    }
    toolcall_scan_free(hr.scan);
    toolcall_set_free(&hr.tools);
    free(hr.whole_split);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum chat_family family = (enum chat_family)(data[0] % CHAT_N_FAMILIES);
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return 0;
    json_object *body = json_tokener_parse_ex(tok, (const char *)data + 1, (int)(size - 1));
    json_tokener_free(tok);
    if (!body)
        return 0;
    if (json_object_is_type(body, json_type_object)) {
        read_chat(body, family);
        char msg[256] = "";
        json_object *chat;
        int rc = responses_chat_body(body, NULL, &chat, msg, sizeof msg);
        if (rc == -1 && !msg[0])
            abort();
        if (rc == 0) {
            read_chat(chat, family);
            json_object_put(chat);
        }
    }
    json_object_put(body);
    return 0;
}
