/*
 * Tests of spec_gate (daemon/sched/speculate.c), which decides from measured decode
 * steps whether a draft source pays: every source runs until measured, then waits for
 * the steps without it to be measured; a slower one sits out but for probes of
 * SPEC_GATE_PROBE_STEPS steps at doubling intervals, one that pays (again) runs at once
 * but for probes of the steps without it; a stream count never measured follows its
 * nearest measured neighbour; each set of sources measures apart; and the draft model
 * is judged against lookup only where the generations may use lookup, by a margin.
 */
#include <string.h>

#include "daemon/sched/speculate.h"
#include "tests/support/test.h"

/* n steps of arm at streams under modes, each making tokens in ms. */
static void record(spec_gate *g, int streams, unsigned modes, enum spec_arm arm, int tokens,
                   double ms, int n)
{
    for (int i = 0; i < n; i++)
        spec_gate_record(g, streams, modes, arm, tokens, ms);
}

/* Of the n steps from `from` on, those on which source is allowed: a bit mask of the
 * first 64, and their count. */
static uint64_t allowed_steps(spec_gate *g, int streams, unsigned modes, unsigned source,
                              uint64_t from, int n, int *count)
{
    uint64_t mask = 0;
    *count = 0;
    for (int i = 0; i < n; i++)
        if (spec_gate_sources(g, streams, modes, from + (uint64_t)i) & source) {
            mask |= i < 64 ? 1ull << i : 0;
            ++*count;
        }
    return mask;
}

static void unmeasured_sources_run(void)
{
    spec_gate g;
    memset(&g, 0, sizeof g);
    unsigned both = SPEC_LOOKUP | SPEC_DRAFT;
    CHECK(spec_gate_sources(&g, 4, both, 0) == both);
    CHECK(spec_gate_sources(&g, 4, SPEC_LOOKUP, 1) == SPEC_LOOKUP);
    CHECK(spec_gate_sources(&g, 4, 0, 2) == 0);
    /* measured too little to be judged */
    record(&g, 4, both, SPEC_ARM_PLAIN, 4, 1.0, 8);
    record(&g, 4, both, SPEC_ARM_DRAFT, 1, 1.0, 7);
    CHECK(spec_gate_sources(&g, 4, both, 3) == both);
}

static void steps_without_a_source_are_measured_first(void)
{
    spec_gate g;
    memset(&g, 0, sizeof g);
    /* the draft model measured, the steps without it not yet: it sits out until they
     * are */
    record(&g, 1, SPEC_DRAFT, SPEC_ARM_DRAFT, 4, 1.0, 8);
    CHECK(spec_gate_sources(&g, 1, SPEC_DRAFT, 0) == 0);
    record(&g, 1, SPEC_DRAFT, SPEC_ARM_PLAIN, 1, 1.0, 8);
    CHECK(spec_gate_sources(&g, 1, SPEC_DRAFT, 1) == SPEC_DRAFT);
    /* what was measured under other sources does not count */
    record(&g, 2, SPEC_LOOKUP, SPEC_ARM_PLAIN, 2, 1.0, 8);
    record(&g, 2, SPEC_LOOKUP, SPEC_ARM_LOOKUP, 8, 1.0, 8);
    CHECK(spec_gate_sources(&g, 2, SPEC_LOOKUP, 2) == SPEC_LOOKUP);
    CHECK(spec_gate_sources(&g, 2, SPEC_LOOKUP | SPEC_DRAFT, 3) == (SPEC_LOOKUP | SPEC_DRAFT));
}

static void slower_source_sits_out_but_for_probes(void)
{
    spec_gate g;
    memset(&g, 0, sizeof g);
    record(&g, 8, SPEC_DRAFT, SPEC_ARM_PLAIN, 8, 6.0, 8);
    record(&g, 8, SPEC_DRAFT, SPEC_ARM_DRAFT, 9, 10.0, 8);
    /* left out from the first judgement (step 100); probes of SPEC_GATE_PROBE_STEPS
     * calls in a row start SPEC_GATE_PROBE steps later, then twice as long each time */
    uint64_t probe = (1ull << SPEC_GATE_PROBE_STEPS) - 1, at = 100;
    int count;
    CHECK(allowed_steps(&g, 8, SPEC_DRAFT, SPEC_DRAFT, at, SPEC_GATE_PROBE, &count) == 0);
    at += SPEC_GATE_PROBE;
    for (int interval = 2 * SPEC_GATE_PROBE; interval <= 4 * SPEC_GATE_PROBE_MAX;
         interval *= 2) {
        int every = interval / 2 < SPEC_GATE_PROBE_MAX ? interval : SPEC_GATE_PROBE_MAX;
        CHECK(allowed_steps(&g, 8, SPEC_DRAFT, SPEC_DRAFT, at, every, &count) == probe);
        CHECK(count == SPEC_GATE_PROBE_STEPS);
        at += (uint64_t)every;
    }
    /* a count of streams without measurements of its own follows the nearest one that
     * has them (here, between probes, it sits out too); one with its own is judged
     * apart */
    CHECK(allowed_steps(&g, 8, SPEC_DRAFT, SPEC_DRAFT, at, 8, &count) == probe);
    CHECK(spec_gate_sources(&g, 7, SPEC_DRAFT, at + 8) == 0);
    CHECK(spec_gate_sources(&g, 5, SPEC_DRAFT, at + 9) == 0);
    record(&g, 1, SPEC_DRAFT, SPEC_ARM_PLAIN, 1, 1.0, 8);
    record(&g, 1, SPEC_DRAFT, SPEC_ARM_DRAFT, 3, 1.0, 8);
    CHECK(spec_gate_sources(&g, 1, SPEC_DRAFT, at + 10) == SPEC_DRAFT);
    CHECK(spec_gate_sources(&g, 2, SPEC_DRAFT, at + 11) == SPEC_DRAFT);
    CHECK(spec_gate_sources(&g, 7, SPEC_DRAFT, at + 12) == 0);
}

static void source_that_pays_again_runs(void)
{
    spec_gate g;
    memset(&g, 0, sizeof g);
    record(&g, 2, SPEC_LOOKUP, SPEC_ARM_PLAIN, 2, 2.0, 8);
    record(&g, 2, SPEC_LOOKUP, SPEC_ARM_LOOKUP, 2, 4.0, 8);
    CHECK(!(spec_gate_sources(&g, 2, SPEC_LOOKUP, 10) & SPEC_LOOKUP));
    /* its probes measure it faster than plain now: it runs at once, and sits out
     * probes of plain steps at the same rhythm */
    record(&g, 2, SPEC_LOOKUP, SPEC_ARM_LOOKUP, 8, 2.0, 30);
    int count;
    CHECK(allowed_steps(&g, 2, SPEC_LOOKUP, SPEC_LOOKUP, 11, SPEC_GATE_PROBE, &count) ==
          ~0ull >> (64 - SPEC_GATE_PROBE));
    uint64_t probe = (1ull << SPEC_GATE_PROBE_STEPS) - 1;
    CHECK(allowed_steps(&g, 2, SPEC_LOOKUP, SPEC_LOOKUP, 11 + SPEC_GATE_PROBE, 64, &count) ==
          ~probe);
}

static void draft_judged_against_what_the_generations_have(void)
{
    spec_gate g;
    memset(&g, 0, sizeof g);
    unsigned both = SPEC_LOOKUP | SPEC_DRAFT;
    record(&g, 1, both, SPEC_ARM_PLAIN, 1, 1.0, 8);  /* 1 token a ms */
    record(&g, 1, both, SPEC_ARM_LOOKUP, 3, 1.0, 8); /* 3 */
    record(&g, 1, both, SPEC_ARM_DRAFT, 2, 1.0, 8);  /* 2 */
    /* generations that may use lookup do better with it than with the draft model */
    CHECK(spec_gate_sources(&g, 1, both, 5) == SPEC_LOOKUP);
    /* those that may not are better off drafting than decoding plainly */
    record(&g, 1, SPEC_DRAFT, SPEC_ARM_PLAIN, 1, 1.0, 8);
    record(&g, 1, SPEC_DRAFT, SPEC_ARM_DRAFT, 2, 1.0, 8);
    CHECK(spec_gate_sources(&g, 1, SPEC_DRAFT, 6) == SPEC_DRAFT);
    /* but not by less than the margin its catch-ups cost */
    record(&g, 2, SPEC_DRAFT, SPEC_ARM_PLAIN, 100, 100.0, 8);
    record(&g, 2, SPEC_DRAFT, SPEC_ARM_DRAFT, 120, 100.0, 8);
    CHECK(spec_gate_sources(&g, 2, SPEC_DRAFT, 7) == 0);
}

int main(void)
{
    RUN(unmeasured_sources_run);
    RUN(steps_without_a_source_are_measured_first);
    RUN(slower_source_sits_out_but_for_probes);
    RUN(source_that_pays_again_runs);
    RUN(draft_judged_against_what_the_generations_have);
    return test_finish();
}
