/* Tests of the GGUF tensor type table. */
#include "engine/quant/quant.h"
#include "tests/support/test.h"

static void block_sizes_match_gguf_layouts(void)
{
    CHECK_EQ(quant_row_bytes(QTYPE_Q8_0, 64), 68);
    CHECK_EQ(quant_row_bytes(QTYPE_Q4_K, 256), 144);
    CHECK_EQ(quant_row_bytes(QTYPE_Q6_K, 512), 420);
    CHECK_EQ(quant_row_bytes(QTYPE_F16, 3), 6);
    CHECK_EQ(quant_row_bytes(QTYPE_Q3_K, 512), 220);
    CHECK_EQ(quant_row_bytes(QTYPE_Q2_K, 512), 168);
    CHECK_EQ(quant_row_bytes(QTYPE_Q4_1, 64), 40);
    CHECK_EQ(quant_row_bytes(QTYPE_Q5_0, 64), 44);
    CHECK_EQ(quant_row_bytes(QTYPE_Q5_1, 64), 48);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ4_NL, 64), 36);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ4_XS, 512), 272);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ2_XXS, 512), 132);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ2_XS, 256), 74);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ2_S, 256), 82);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ3_XXS, 256), 98);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ3_S, 256), 110);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ1_S, 256), 50);
    CHECK_EQ(quant_row_bytes(QTYPE_IQ1_M, 256), 56);
}

/* The types this engine multiplies with: every type llama.cpp's K-quant and i-quant mixes
 * and their fallbacks put in a file. */
static void computable_types(void)
{
    static const uint32_t types[] = {QTYPE_F32,  QTYPE_F16,  QTYPE_BF16, QTYPE_Q8_0,
                                     QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1,
                                     QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K,
                                     QTYPE_Q6_K, QTYPE_IQ4_NL, QTYPE_IQ4_XS, QTYPE_IQ2_XXS,
                                     QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS, QTYPE_IQ3_S,
                                     QTYPE_IQ1_S, QTYPE_IQ1_M};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        CHECK_MSG(quant_traits_of(types[i])->computable, "%s", quant_traits_of(types[i])->name);
    CHECK(!quant_traits_of(QTYPE_Q8_K)->computable);
    CHECK(!quant_traits_of(QTYPE_TQ1_0)->computable);
}

static void partial_blocks_and_unknown_types_are_rejected(void)
{
    CHECK_EQ(quant_row_bytes(QTYPE_Q8_0, 33), 0);
    CHECK(quant_traits_of(4) == NULL);
    CHECK(quant_traits_of(1000) == NULL);
}

int main(void)
{
    RUN(block_sizes_match_gguf_layouts);
    RUN(computable_types);
    RUN(partial_blocks_and_unknown_types_are_rejected);
    return test_finish();
}
