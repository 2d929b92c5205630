/* quant.c — type traits of GGUF tensor types (see quant.h). */
#include "engine/quant.h"

static const quant_traits traits_by_id[QTYPE_COUNT] = {
    [QTYPE_F32] = {"F32", 1, 4, true},
    [QTYPE_F16] = {"F16", 1, 2, true},
    [QTYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [QTYPE_Q4_1] = {"Q4_1", 32, 20, false},
    [QTYPE_Q5_0] = {"Q5_0", 32, 22, false},
    [QTYPE_Q5_1] = {"Q5_1", 32, 24, false},
    [QTYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [QTYPE_Q8_1] = {"Q8_1", 32, 36, false},
    [QTYPE_Q2_K] = {"Q2_K", 256, 84, false},
    [QTYPE_Q3_K] = {"Q3_K", 256, 110, false},
    [QTYPE_Q4_K] = {"Q4_K", 256, 144, true},
    [QTYPE_Q5_K] = {"Q5_K", 256, 176, true},
    [QTYPE_Q6_K] = {"Q6_K", 256, 210, true},
    [QTYPE_Q8_K] = {"Q8_K", 256, 292, false},
    [QTYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, false},
    [QTYPE_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [QTYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, false},
    [QTYPE_IQ1_S] = {"IQ1_S", 256, 50, false},
    [QTYPE_IQ4_NL] = {"IQ4_NL", 32, 18, false},
    [QTYPE_IQ3_S] = {"IQ3_S", 256, 110, false},
    [QTYPE_IQ2_S] = {"IQ2_S", 256, 82, false},
    [QTYPE_IQ4_XS] = {"IQ4_XS", 256, 136, false},
    [QTYPE_I8] = {"I8", 1, 1, false},
    [QTYPE_I16] = {"I16", 1, 2, false},
    [QTYPE_I32] = {"I32", 1, 4, false},
    [QTYPE_I64] = {"I64", 1, 8, false},
    [QTYPE_F64] = {"F64", 1, 8, false},
    [QTYPE_IQ1_M] = {"IQ1_M", 256, 56, false},
    [QTYPE_BF16] = {"BF16", 1, 2, true},
    [QTYPE_TQ1_0] = {"TQ1_0", 256, 54, false},
    [QTYPE_TQ2_0] = {"TQ2_0", 256, 66, false},
};

const quant_traits *quant_traits_of(uint32_t t)
{
    if (t >= QTYPE_COUNT || traits_by_id[t].name == NULL)
        return NULL;
    return &traits_by_id[t];
}

size_t quant_row_bytes(uint32_t t, int64_t n)
{
    const quant_traits *tr = quant_traits_of(t);
    if (!tr || n < 0 || n % tr->block_size != 0)
        return 0;
    return (size_t)(n / tr->block_size) * tr->block_bytes;
}
