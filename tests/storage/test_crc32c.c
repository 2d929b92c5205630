/* Tests of CRC-32C: published check values, both code paths, chaining. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/crc32c.h"
#include "tests/support/test.h"

static void check_values(void)
{
    /* "123456789" is the catalogue check value; the rest are from RFC 3720 B.4. */
    uint8_t buf[32];
    CHECK_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    memset(buf, 0, sizeof buf);
    CHECK_EQ(crc32c(0, buf, 32), 0x8A9136AAu);
    CHECK_EQ(crc32c_portable(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof buf);
    CHECK_EQ(crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    CHECK_EQ(crc32c(0, buf, 32), 0x46DD794Eu);
    CHECK_EQ(crc32c_portable(0, buf, 32), 0x46DD794Eu);
    CHECK_EQ(crc32c(0, buf, 0), 0);
}

static void paths_agree_and_chain(void)
{
    uint8_t buf[1000];
    srand(7);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rand();
    for (size_t off = 0; off < 9; off++) {
        for (size_t n = 0; n + off <= sizeof buf; n += 1 + n / 3) {
            uint32_t a = crc32c(0, buf + off, n), b = crc32c_portable(0, buf + off, n);
            CHECK_MSG(a == b, "offset %zu length %zu: %08x vs %08x", off, n, a, b);
            size_t cut = n / 3;
            CHECK_EQ(crc32c(crc32c(0, buf + off, cut), buf + off + cut, n - cut), a);
        }
    }
    uint32_t before = crc32c(0, buf, sizeof buf);
    buf[500] ^= 0x10;
    CHECK(crc32c(0, buf, sizeof buf) != before);
}

int main(void)
{
    RUN(check_values);
    RUN(paths_agree_and_chain);
    return test_finish();
}
