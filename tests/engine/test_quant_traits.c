/* Tests of the GGUF tensor type table. */
#include "engine/quant/quant.h"
#include "tests/support/test.h"

static void block_sizes_match_gguf_layouts(void)
{
    CHECK_EQ(quant_row_bytes(QTYPE_Q8_0, 64), 68);
    CHECK_EQ(quant_row_bytes(QTYPE_Q4_K, 256), 144);
    CHECK_EQ(quant_row_bytes(QTYPE_Q6_K, 512), 420);
    CHECK_EQ(quant_row_bytes(QTYPE_F16, 3), 6);
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
    RUN(partial_blocks_and_unknown_types_are_rejected);
    return test_finish();
}
