/*
 * Tests of the text a Call adds to a context: the first turn is the whole rendering,
 * later turns only what extends the text the context holds, and templates that rewrite
 * history fall back to the new turn alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prompt.h"
#include "tests/support/test.h"

/* A context whose history is the given (role, text) pairs. */
static void make_ctx(ctx_entry *c, const char *system, ctx_msg *msgs, int n)
{
    memset(c, 0, sizeof *c);
    c->system_prompt = (char *)system;
    c->msgs = msgs;
    c->n_msgs = n;
    c->n_tokens = n ? 10 : 0;
}

static int text_is(enum chat_family f, const ctx_entry *c, const char *generated,
                   const char *prompt, const char *want)
{
    char err[ERR_MAX];
    char *got = prompt_turn_text(f, c, generated, prompt, err);
    int ok = got && strcmp(got, want) == 0;
    if (!ok)
        fprintf(stderr, "got [%s]\nwant [%s]\n", got ? got : err, want);
    free(got);
    return ok;
}

static void first_turn_is_whole_rendering(void)
{
    ctx_entry c;
    make_ctx(&c, "Be brief.", NULL, 0);
    CHECK(text_is(CHAT_CHATML, &c, NULL, "Hi",
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n"));
    make_ctx(&c, NULL, NULL, 0);
    CHECK(text_is(CHAT_CHATML, &c, NULL, "Hi", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
}

static void later_turn_extends_the_context(void)
{
    ctx_entry c;
    /* The reply ended on the end-of-turn token (not kept): the suffix closes the turn. */
    ctx_msg m1[] = {{"user", "Hi", 3}, {"assistant", "Hello!", 2}};
    make_ctx(&c, "S", m1, 2);
    CHECK(text_is(CHAT_CHATML, &c, "Hello!", "More",
                  "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"));
    /* The reply ended on the stop string "<|im_end|>", which the context holds. */
    CHECK(text_is(CHAT_CHATML, &c, "Hello!<|im_end|>", "More",
                  "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"));
    /* A reply cut at a user's stop string ("!"): what the context holds does not
     * continue the rendering; the reply's turn is still closed before the new one. */
    ctx_msg m2[] = {{"user", "Hi", 3}, {"assistant", "Hello", 2}};
    make_ctx(&c, "S", m2, 2);
    CHECK(text_is(CHAT_CHATML, &c, "Hello! Bye", "More",
                  "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"));
}

/* Templates that put a space before the reply (" [/INST] reply</s>") where the turn's
 * opening ends without it: a reply the model began with a space is not where the
 * rendering has it, yet the turn end ("</s>") must close it (it went missing: the next
 * turn followed the reply directly). */
static void turn_end_after_a_spaced_reply(void)
{
    ctx_entry c;
    ctx_msg m[] = {{"user", "Hi", 3}, {"assistant", " Hello", 2}};
    make_ctx(&c, NULL, m, 2);
    CHECK(text_is(CHAT_MISTRAL_V1, &c, " Hello", "More", "</s> [INST] More [/INST]"));
    CHECK(text_is(CHAT_VICUNA, &c, " Hello", "More", "</s>\nUSER: More\nASSISTANT:"));
    /* the end of turn already in the context (a stop string held it back) is not doubled */
    CHECK(text_is(CHAT_MISTRAL_V1, &c, " Hello</s>", "More", " [INST] More [/INST]"));
}

static void rewriting_templates_fall_back(void)
{
    ctx_entry c;
    /* llama3 trims contents, so " Hello " is not a prefix of the new rendering. */
    ctx_msg m[] = {{"user", "Hi", 3}, {"assistant", " Hello ", 2}};
    make_ctx(&c, NULL, m, 2);
    CHECK(text_is(CHAT_LLAMA3, &c, " Hello ", "More",
                  "<|start_header_id|>user<|end_header_id|>\n\nMore<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    /* A raw turn in the history: the new turn alone. */
    ctx_msg r[] = {{"raw", "free text", 3}, {"assistant", "reply", 1}};
    make_ctx(&c, NULL, r, 2);
    CHECK(text_is(CHAT_CHATML, &c, "reply", "Q", "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"));
}

/* gpt-oss: replies held as the model wrote them, reasoning and all; the template takes
 * their answers back and drops the reasoning, which the context keeps. */
static void harmony_replies_extend_the_context(void)
{
#define OSS_REPLY(think, answer)                                                            \
    "<|channel|>analysis<|message|>" think "<|end|><|start|>assistant<|channel|>final"     \
    "<|message|>" answer
    ctx_entry c;
    ctx_msg m[] = {{"user", "Hi", 3}, {"assistant", OSS_REPLY("Greet.", "Hello!"), 9}};
    make_ctx(&c, "Be brief.", m, 2);
    const char *turn = "<|start|>user<|message|>More<|end|><|start|>assistant";
    char want[256];
    snprintf(want, sizeof want, "<|end|>%s", turn);
    CHECK(text_is(CHAT_GPT_OSS, &c, OSS_REPLY("Greet.", "Hello!"), "More", want));
    /* a reply whose last message is closed already ("<|end|>" is no end of generation) */
    CHECK(text_is(CHAT_GPT_OSS, &c, OSS_REPLY("Greet.", "Hello!") "<|end|>", "More", turn));
    /* without reasoning the reply continues the rendering */
    ctx_msg f[] = {{"user", "Hi", 3}, {"assistant", "<|channel|>final<|message|>Hello!", 4}};
    make_ctx(&c, "Be brief.", f, 2);
    CHECK(text_is(CHAT_GPT_OSS, &c, f[1].text, "More", want));
    /* later turns: the earlier replies are taken back by their answers, so the whole
     * conversation still renders and the system turn is not written again */
    ctx_msg m3[] = {{"user", "Hi", 3},
                    {"assistant", OSS_REPLY("Greet.", "Hello!"), 9},
                    {"user", "More", 3},
                    {"assistant", OSS_REPLY("Count.", "Two."), 9}};
    make_ctx(&c, "Be brief.", m3, 4);
    CHECK(text_is(CHAT_GPT_OSS, &c, m3[3].text, "Last",
                  "<|end|><|start|>user<|message|>Last<|end|><|start|>assistant"));
    /* a reply cut while thinking: closed, an empty answer */
    ctx_msg t[] = {{"user", "Hi", 3}, {"assistant", "<|channel|>analysis<|message|>Hm", 4}};
    make_ctx(&c, NULL, t, 2);
    CHECK(text_is(CHAT_GPT_OSS, &c, t[1].text, "More", want));
#undef OSS_REPLY
}

int main(void)
{
    RUN(first_turn_is_whole_rendering);
    RUN(later_turn_extends_the_context);
    RUN(turn_end_after_a_spaced_reply);
    RUN(rewriting_templates_fall_back);
    RUN(harmony_replies_extend_the_context);
    return test_finish();
}
