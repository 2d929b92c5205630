/* crc32c.c — CRC-32C, hardware instruction or slicing-by-8 tables (see crc32c.h). */
#include "storage/crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_table[8][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;
static bool crc32c_have_hw;

static void crc32c_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^
                                 crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc32c_have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc32c_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        /* The tables assume little-endian words, which is every machine llmsd targets. */
        lo ^= c;
        c = crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff] ^
            crc32c_table[5][(lo >> 16) & 0xff] ^ crc32c_table[4][lo >> 24] ^
            crc32c_table[3][hi & 0xff] ^ crc32c_table[2][(hi >> 8) & 0xff] ^
            crc32c_table[1][(hi >> 16) & 0xff] ^ crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc32c_table[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const uint8_t *p,
                                                             size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc32c_once, crc32c_init);
#if defined(__x86_64__)
    if (crc32c_have_hw)
        return ~crc32c_hw(~crc, p, n);
#endif
    return ~crc32c_sw(~crc, p, n);
}

uint32_t crc32c_portable(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc32c_once, crc32c_init);
    return ~crc32c_sw(~crc, p, n);
}
