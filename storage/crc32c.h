/*
 * crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * chunk files. Uses the SSE4.2 crc32 instruction when the CPU has it, a table-driven
 * loop otherwise; both give the same values.
 */
#ifndef LLMS_STORAGE_CRC32C_H
#define LLMS_STORAGE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of n bytes at p, continuing from crc (0 to start): crc32c(0, "123456789", 9)
 * is 0xE3069283, and crc32c(crc32c(0, a, n), b, m) is the CRC of a followed by b. */
uint32_t crc32c(uint32_t crc, const void *p, size_t n);

/* The table-driven path alone, so tests can check it on CPUs that take the other. */
uint32_t crc32c_portable(uint32_t crc, const void *p, size_t n);

#endif
