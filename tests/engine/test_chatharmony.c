/*
 * Tests of gpt-oss's harmony prompt (engine/tok/chatharmony.h) against what its chat
 * template (openai/gpt-oss-20b's chat_template.jinja, as transformers and llama.cpp's
 * --jinja render it) writes for the same messages, written out by hand here: a plain
 * chat, the system and developer messages, tools, tool results, earlier replies'
 * reasoning, each reasoning effort, the refusals of the template; the family's detection
 * from its template and from its vocabulary, and chat_apply's date; "<|end|>" not ending
 * generation in a harmony vocabulary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gguf/gguf.h"
#include "engine/tok/chat.h"
#include "engine/tok/chatharmony.h"
#include "engine/tok/chattools.h"
#include "engine/tok/tokenizer.h"
#include "tests/support/test.h"

#define SYS_HEAD                                                                            \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" \
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\n"
#define CHANNELS "# Valid channels: analysis, commentary, final. Channel must be included for every message."
#define SYS(effort) SYS_HEAD "Reasoning: " effort "\n\n" CHANNELS "<|end|>"
#define SYS_TOOLS(effort)                                                                   \
    SYS_HEAD "Reasoning: " effort "\n\n" CHANNELS                                           \
             "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"

/* get_weather as the template's render_tool_namespace writes it */
#define WEATHER_TS                                                                          \
    "// Get the weather in a city\ntype get_weather = (_: {\n// The city\ncity: string,\n"  \
    "unit?: \"c\" | \"f\", // default: c,\n}) => any;\n\n"

static const struct chat_tool_call PARIS = {"get_weather", "{\"city\": \"Paris\"}", NULL};

/* The prompt of msgs[0..n) (tools: WEATHER_TS or none), or NULL when refused; fresh. */
static char *render(const char *effort, const char *const *reasoning, bool tools,
                    const struct chat_tool_message *msgs, int n, bool gen)
{
    struct chat_harmony_opts o = {"2025-08-05", effort, reasoning};
    const char *defs[] = {WEATHER_TS};
    int len = chat_harmony_apply(&o, defs, tools ? 1 : 0, msgs, n, gen, NULL, 0);
    char *out = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (out && chat_harmony_apply(&o, defs, tools ? 1 : 0, msgs, n, gen, out, (size_t)len + 1) != len) {
        free(out);
        return NULL;
    }
    return out;
}

#define EXPECT(got, want)                                                             \
    do {                                                                              \
        char *g_ = (got);                                                             \
        CHECK_MSG(g_ && strcmp(g_, (want)) == 0, "got:\n%s\nwant:\n%s", g_ ? g_ : "(refused)", \
                  (want));                                                            \
        free(g_);                                                                     \
    } while (0)

static void plain_chat(void)
{
    const struct chat_tool_message m[] = {{"user", "Hi", NULL, 0, NULL}};
    EXPECT(render(NULL, NULL, false, m, 1, true),
           SYS("medium") "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    EXPECT(render(NULL, NULL, false, m, 1, false),
           SYS("medium") "<|start|>user<|message|>Hi<|end|>");
}

static void each_effort(void)
{
    const struct chat_tool_message m[] = {{"user", "Hi", NULL, 0, NULL}};
    EXPECT(render("low", NULL, false, m, 1, true),
           SYS("low") "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    EXPECT(render("medium", NULL, false, m, 1, true),
           SYS("medium") "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    EXPECT(render("high", NULL, false, m, 1, true),
           SYS("high") "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    CHECK(!render("max", NULL, false, m, 1, true));
    CHECK(chat_harmony_effort_valid("low") && !chat_harmony_effort_valid("minimal") &&
          !chat_harmony_effort_valid(NULL));
}

/* The first message, system or developer, is the developer turn's instructions; a later
 * system message is dropped; an empty one writes no developer turn */
static void system_and_developer(void)
{
    const struct chat_tool_message sys[] = {{"system", "Be brief.", NULL, 0, NULL},
                                            {"user", "Hi", NULL, 0, NULL},
                                            {"system", "Dropped.", NULL, 0, NULL}};
    const char *want = SYS("medium") "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n"
                                     "<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant";
    EXPECT(render(NULL, NULL, false, sys, 3, true), want);
    const struct chat_tool_message dev[] = {{"developer", "Be brief.", NULL, 0, NULL},
                                            {"user", "Hi", NULL, 0, NULL}};
    EXPECT(render(NULL, NULL, false, dev, 2, true), want);
    const struct chat_tool_message empty[] = {{"system", "", NULL, 0, NULL},
                                              {"user", "Hi", NULL, 0, NULL}};
    EXPECT(render(NULL, NULL, false, empty, 2, true),
           SYS("medium") "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    /* a developer message after the first is dropped too */
    const struct chat_tool_message later[] = {{"user", "Hi", NULL, 0, NULL},
                                              {"developer", "x", NULL, 0, NULL}};
    EXPECT(render(NULL, NULL, false, later, 2, true),
           SYS("medium") "<|start|>user<|message|>Hi<|end|><|start|>assistant");
}

static void tools(void)
{
    const struct chat_tool_message m[] = {{"system", "Be brief.", NULL, 0, NULL},
                                          {"user", "Weather?", NULL, 0, NULL}};
    EXPECT(render(NULL, NULL, true, m, 2, true),
           SYS_TOOLS("medium") "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n"
                               "# Tools\n\n## functions\n\nnamespace functions {\n\n" WEATHER_TS
                               "} // namespace functions<|end|><|start|>user<|message|>Weather?"
                               "<|end|><|start|>assistant");
    EXPECT(render("high", NULL, true, m + 1, 1, true),
           SYS_TOOLS("high") "<|start|>developer<|message|># Tools\n\n## functions\n\n"
                             "namespace functions {\n\n" WEATHER_TS "} // namespace functions"
                             "<|end|><|start|>user<|message|>Weather?<|end|><|start|>assistant");
}

/* A call of the turn in progress keeps its reasoning (or, without one, its text) before
 * it; its result answers it as a JSON string */
static void tool_results(void)
{
    const struct chat_tool_message m[] = {
        {"user", "Weather in Paris?", NULL, 0, NULL},
        {"assistant", "", &PARIS, 1, NULL},
        {"tool", "{\"temp\": 20, \"sky\": \"cl\xc3\xa9\x61r\"}", NULL, 0, NULL},
    };
    const char *reasoning[] = {NULL, "Need the weather.", NULL};
    const char *call = "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                       "<|message|>{\"city\": \"Paris\"}<|call|>";
    const char *result = "<|start|>functions.get_weather to=assistant<|channel|>commentary"
                         "<|message|>\"{\\\"temp\\\": 20, \\\"sky\\\": \\\"cl\xc3\xa9\x61r\\\"}\""
                         "<|end|>";
    char want[2048];
    snprintf(want, sizeof want,
             SYS_TOOLS("medium") "<|start|>developer<|message|># Tools\n\n## functions\n\n"
                                 "namespace functions {\n\n" WEATHER_TS "} // namespace functions"
                                 "<|end|><|start|>user<|message|>Weather in Paris?<|end|>"
                                 "<|start|>assistant<|channel|>analysis<|message|>Need the "
                                 "weather.<|end|>%s%s<|start|>assistant",
             call, result);
    EXPECT(render(NULL, reasoning, true, m, 3, true), want);
    /* the text said with the call, when there is no reasoning */
    struct chat_tool_message with_text[3];
    memcpy(with_text, m, sizeof m);
    with_text[1].content = "Let me look.";
    snprintf(want, sizeof want,
             SYS("medium") "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"
                           "<|channel|>analysis<|message|>Let me look.<|end|>%s%s"
                           "<|start|>assistant",
             call, result);
    EXPECT(render(NULL, NULL, false, with_text, 3, true), want);
}

/* Earlier replies lose their reasoning: a final one always, a call's once a final reply
 * follows it */
static void multi_turn_reasoning(void)
{
    const struct chat_tool_message m[] = {
        {"user", "Weather in Paris?", NULL, 0, NULL},
        {"assistant", "", &PARIS, 1, NULL},
        {"tool", "sunny", NULL, 0, NULL},
        {"assistant", "Sunny.", NULL, 0, NULL},
        {"user", "Thanks", NULL, 0, NULL},
    };
    const char *reasoning[] = {NULL, "Need the weather.", NULL, "It says sunny.", NULL};
    EXPECT(render(NULL, reasoning, false, m, 5, true),
           SYS("medium") "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant "
                         "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":"
                         " \"Paris\"}<|call|><|start|>functions.get_weather to=assistant<|channel|>"
                         "commentary<|message|>\"sunny\"<|end|><|start|>assistant<|channel|>final"
                         "<|message|>Sunny.<|end|><|start|>user<|message|>Thanks<|end|>"
                         "<|start|>assistant");
    /* a conversation ending with a reply, without the generation prompt (a training
     * example): its reasoning, and <|return|> */
    EXPECT(render(NULL, reasoning, false, m, 4, false),
           SYS("medium") "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant "
                         "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":"
                         " \"Paris\"}<|call|><|start|>functions.get_weather to=assistant<|channel|>"
                         "commentary<|message|>\"sunny\"<|end|><|start|>assistant<|channel|>"
                         "analysis<|message|>It says sunny.<|end|><|start|>assistant<|channel|>"
                         "final<|message|>Sunny.<|return|>");
    /* only a message's first call is written */
    const struct chat_tool_call two[] = {PARIS, {"get_time", "{}", NULL}};
    const struct chat_tool_message calls[] = {{"user", "q", NULL, 0, NULL},
                                              {"assistant", "", two, 2, NULL}};
    EXPECT(render(NULL, NULL, false, calls, 2, false),
           SYS("medium") "<|start|>user<|message|>q<|end|><|start|>assistant to=functions."
                         "get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}"
                         "<|call|>");
}

static void refusals(void)
{
    /* a result with no call before it */
    const struct chat_tool_message orphan[] = {{"user", "q", NULL, 0, NULL},
                                               {"tool", "x", NULL, 0, NULL}};
    CHECK(!render(NULL, NULL, false, orphan, 2, true));
    /* a reply holding the channel markup, in its text or its reasoning */
    const struct chat_tool_message markup[] = {
        {"user", "q", NULL, 0, NULL},
        {"assistant", "<|channel|>final<|message|>a", NULL, 0, NULL}};
    CHECK(!render(NULL, NULL, false, markup, 2, true));
    const struct chat_tool_message plain[] = {{"user", "q", NULL, 0, NULL},
                                              {"assistant", "a", NULL, 0, NULL}};
    const char *bad_reasoning[] = {NULL, "<|channel|>analysis<|message|>r"};
    CHECK(!render(NULL, bad_reasoning, false, plain, 2, true));
    /* a call with both text and reasoning */
    const struct chat_tool_message both[] = {{"user", "q", NULL, 0, NULL},
                                             {"assistant", "text", &PARIS, 1, NULL}};
    const char *reasoning[] = {NULL, "r"};
    CHECK(!render(NULL, reasoning, false, both, 2, true));
    /* a call outside an assistant message, an unknown role, no date */
    const struct chat_tool_message user_call[] = {{"user", "q", &PARIS, 1, NULL}};
    CHECK(!render(NULL, NULL, false, user_call, 1, true));
    const struct chat_tool_message fn[] = {{"function", "q", NULL, 0, NULL}};
    CHECK(!render(NULL, NULL, false, fn, 1, true));
    struct chat_harmony_opts o = {NULL, NULL, NULL};
    CHECK_EQ(chat_harmony_apply(&o, NULL, 0, plain, 1, true, NULL, 0), -1);
}

/* The template's own text, its markers; the family's name; chat_apply and
 * chat_apply_tools write it with today's date and the default effort */
static void family(void)
{
    static const char tmpl[] =
        "{{- \"<|start|>system<|message|>\" }}{{- build_system_message() }}{{- \"<|end|>\" }}"
        "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}"
        "{%- if add_generation_prompt -%}\n<|start|>assistant\n{%- endif -%}";
    CHECK_EQ(chat_detect(tmpl), CHAT_GPT_OSS);
    CHECK_EQ(chat_detect("gpt-oss"), CHAT_GPT_OSS);
    CHECK(!strcmp(chat_family_name(CHAT_GPT_OSS), "gpt-oss"));
    CHECK(!strcmp(chat_stop_text(CHAT_GPT_OSS), "<|return|>"));
    CHECK_EQ(chat_thinking(CHAT_GPT_OSS), CHAT_THINK_HARMONY);
    CHECK(chat_tool_syntax(CHAT_GPT_OSS) != NULL);
    char date[16], want[1024], out[1024];
    time_t now = time(NULL);
    struct tm day;
    localtime_r(&now, &day);
    strftime(date, sizeof date, "%Y-%m-%d", &day);
    const struct chat_message m[] = {{"system", "Be brief."}, {"user", "Hi"}};
    snprintf(want, sizeof want,
             "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
             "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: %s\n\nReasoning: medium\n\n"
             CHANNELS "<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n"
             "<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant", date);
    int n = chat_apply(CHAT_GPT_OSS, m, 2, true, out, sizeof out);
    /* (a day may turn between the two) */
    CHECK_MSG(n == (int)strlen(want) && !strcmp(out, want), "%s", out);
    const struct chat_tool_message tm[] = {{"user", "Hi", NULL, 0, NULL}};
    CHECK(chat_apply_tools(CHAT_GPT_OSS, NULL, 0, "2025-08-05", tm, 1, true, true, out,
                           sizeof out) > 0);
    CHECK_MSG(!strcmp(out, SYS("medium") "<|start|>user<|message|>Hi<|end|><|start|>assistant"),
              "%s", out);
}

/* A file's vocabulary with harmony's control tokens and no template is gpt-oss's; its
 * tokenizer does not end generation at "<|end|>" but at "<|return|>" and "<|call|>" */
static void vocabulary(void)
{
    static const char *const words[] = {"<unk>", "<s>", "</s>", "<|start|>", "<|channel|>",
                                        "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                                        "a", "b"};
    enum { N = sizeof words / sizeof words[0] };
    float scores[N];
    int32_t types[N];
    for (int i = 0; i < N; i++) {
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 9 ? 3 : 1;
    }
    char path[1024], err[ERR_MAX];
    for (int with_call = 0; with_call < 2; with_call++) {
        snprintf(path, sizeof path, "%s/harmony-vocab-%d.gguf", test_tmpdir(), with_call);
        gguf_writer *w = gguf_writer_new();
        /* without "<|call|>" it is not harmony's: the last word stands in its place */
        const char *strs[N];
        memcpy(strs, words, sizeof strs);
        if (!with_call)
            strs[8] = "c";
        bool ok = w && gguf_writer_set_str(w, "general.architecture", "llama") == 0 &&
                  gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") == 0 &&
                  gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", strs, N) == 0 &&
                  gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, scores, N) == 0 &&
                  gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, N) == 0 &&
                  gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) == 0 &&
                  gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2) == 0 &&
                  gguf_writer_write(w, path, err) == 0;
        gguf_writer_free(w);
        CHECK_MSG(ok, "%s", err);
        gguf_file *g = gguf_open(path, err);
        CHECK_MSG(g, "%s", err);
        CHECK_EQ(chat_detect_file(g), with_call ? CHAT_GPT_OSS : CHAT_PLAIN);
        tokenizer *t = NULL;
        CHECK_MSG(tok_load(g, &t, err) == 0, "%s", err);
        CHECK_EQ(tok_is_eog(t, 6), !with_call); /* <|end|> */
        CHECK_EQ(tok_is_eog(t, 7), true);       /* <|return|> */
        tok_free(t);
        gguf_close(g);
    }
}

/* A reply as the model wrote it, taken back by its answer. */
static void answers(void)
{
    static const struct {
        const char *reply, *answer;
    } cases[] = {
        {"<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>"
         "Four.", "Four."},
        {"<|channel|>final<|message|>Four.<|return|>", "Four."},
        {"<|channel|>final<|message|>One.<|end|><|start|>assistant<|channel|>final<|message|>"
         "Two.<|end|>", "Two."},
        {"<|channel|>analysis<|message|>Still thinking", ""},
        {"Plain text.", "Plain text."},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *a;
        size_t n;
        chat_harmony_answer(cases[i].reply, &a, &n);
        CHECK_MSG(n == strlen(cases[i].answer) && !memcmp(a, cases[i].answer, n), "%zu: '%.*s'",
                  i, (int)n, a);
    }
}

int main(void)
{
    RUN(plain_chat);
    RUN(each_effort);
    RUN(system_and_developer);
    RUN(tools);
    RUN(tool_results);
    RUN(multi_turn_reasoning);
    RUN(refusals);
    RUN(family);
    RUN(vocabulary);
    RUN(answers);
    return test_finish();
}
