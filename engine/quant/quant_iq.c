/*
 * quant_iq.c — the i-quants below 4 bits (see quant_iq.h): their codebooks, the unpacking
 * of their bit layouts, the scalar kernels and the reference quantizer.
 */
#include "engine/quant/quant_iq.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/*
 * The codebooks, which the GGUF format fixes (ggml's tables, from llama.cpp, MIT
 * licence). Each is a set of points of a lattice of n_levels^dim points; it is kept as
 * one bit per lattice point, point i having value j = levels[(i / n_levels^j) % n_levels],
 * and entry k of a codebook is its k-th point in that order.
 */
/* IQ2_XXS: 256 of the 3^8 points */
static const uint8_t iq2xxs_lattice[] =
    "\x55\x15\x14\x55\x10\x44\x41\x41\x00\x04\x14\x44\x00\x10\x00\x00\x00\x04\x40\x00\x14\x00"
    "\x40\x00\x00\x00\x00\x04\x00\x00\x50\x10\x40\x41\x11\x00\x01\x14\x04\x40\x50\x04\x40\x00"
    "\x10\x00\x00\x05\x10\x00\x00\x50\x00\x00\x01\x00\x00\x40\x00\x00\x41\x14\x04\x40\x14\x14"
    "\x00\x00\x04\x00\x00\x04\x00\x00\x04\x00\x00\x00\x00\x00\x00\x04\x10\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x14\x04\x10\x10\x00\x40\x00\x04\x11\x00\x04\x01\x10\x00\x40\x40\x00\x01\x00"
    "\x00\x00\x00\x00\x01\x04\x00\x00\x00\x00\x00\x10\x04\x40\x04\x40\x00\x00\x04\x00\x00\x00"
    "\x00\x10\x00\x00\x00\x10\x00\x00\x00\x40\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x05\x01"
    "\x00\x04\x00\x00\x40\x00\x00\x00\x11\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"
    "\x40\x00\x00\x00\x00\x00\x14\x04\x00\x00\x01\x00\x01\x05\x00\x00\x00\x00\x00\x10\x10\x00"
    "\x00\x00\x00\x00\x50\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x41\x00\x00\x01\x40\x00\x00"
    "\x00\x00\x40\x00\x00\x00\x04\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00"
    "\x00\x40\x00\x04\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x01\x00\x00\x00\x00\x00\x50\x10\x44\x41\x10\x10\x01\x14\x04\x00\x10\x00\x40"
    "\x00\x00\x00\x04\x44\x00\x00\x40\x40\x00\x00\x40\x40\x00\x01\x00\x00\x40\x10\x00\x01\x00"
    "\x00\x00\x10\x00\x10\x00\x00\x04\x10\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x14\x04\x00\x10\x01\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x10\x01\x04"
    "\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x04\x00\x10\x44\x50\x00\x00\x00\x00\x04\x01\x00"
    "\x00\x01\x00\x00\x04\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x40\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00"
    "\x00\x00\x01\x00\x00\x00\x00\x04\x10\x04\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x40\x00"
    "\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x41\x00\x00\x01\x00\x00"
    "\x01\x00\x00\x40\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x10\x00\x00"
    "\x00\x00\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x04\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x41\x00\x00"
    "\x04\x00\x00\x40\x00\x00\x00\x04\x40\x00\x04\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x14\x44\x00\x10\x00\x40\x00\x00\x00\x00\x04\x00\x00\x00\x04\x00\x00"
    "\x00\x10\x00\x00\x04\x00\x40\x00\x00\x01\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x04\x01\x10\x04\x00\x00\x00\x00\x00\x01\x00\x40\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00"
    "\x00\x00\x01\x00\x00\x00\x00\x00\x04\x00\x40\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x10\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x04\x00\x00\x00\x10\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x04\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00";

/* IQ2_XS: 512 of the 3^8 points */
static const uint8_t iq2xs_lattice[] =
    "\x55\x55\x55\x51\x55\x45\x41\x15\x45\x01\x54\x55\x55\x50\x45\x41\x10\x05\x01\x00\x54\x51"
    "\x10\x40\x41\x04\x00\x01\x01\x00\x50\x55\x45\x41\x15\x15\x01\x14\x04\x00\x50\x45\x41\x00"
    "\x05\x01\x04\x04\x00\x00\x40\x41\x00\x10\x05\x00\x00\x40\x00\x00\x40\x55\x05\x11\x14\x04"
    "\x01\x10\x00\x40\x40\x05\x01\x00\x04\x00\x00\x40\x10\x00\x00\x01\x00\x04\x01\x00\x00\x00"
    "\x00\x10\x01\x54\x55\x51\x50\x45\x41\x40\x05\x01\x00\x54\x51\x10\x40\x41\x00\x00\x01\x50"
    "\x00\x50\x11\x00\x40\x00\x00\x01\x00\x00\x00\x50\x45\x41\x00\x45\x01\x10\x04\x00\x00\x40"
    "\x41\x00\x00\x01\x00\x00\x00\x00\x00\x40\x00\x04\x00\x00\x01\x00\x00\x00\x00\x00\x05\x05"
    "\x00\x04\x40\x00\x00\x04\x00\x00\x11\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00"
    "\x40\x00\x00\x00\x00\x00\x55\x55\x10\x40\x41\x00\x00\x01\x00\x04\x50\x10\x00\x40\x10\x00"
    "\x10\x00\x00\x00\x10\x00\x00\x01\x00\x00\x00\x04\x00\x00\x44\x41\x00\x40\x01\x00\x00\x00"
    "\x00\x00\x40\x00\x00\x00\x04\x10\x00\x00\x00\x10\x00\x01\x00\x01\x00\x00\x00\x00\x00\x00"
    "\x10\x41\x01\x04\x00\x00\x01\x00\x10\x00\x04\x00\x00\x00\x00\x00\x00\x10\x00\x01\x00\x00"
    "\x01\x10\x00\x00\x00\x00\x44\x01\x00\x50\x55\x45\x41\x55\x05\x11\x14\x04\x00\x50\x45\x41"
    "\x00\x05\x01\x00\x44\x00\x40\x40\x41\x01\x40\x01\x00\x00\x00\x00\x00\x40\x15\x45\x01\x14"
    "\x04\x00\x10\x00\x01\x00\x05\x01\x10\x04\x00\x00\x00\x00\x40\x00\x01\x01\x00\x40\x10\x00"
    "\x00\x00\x00\x00\x14\x04\x00\x10\x01\x01\x01\x00\x00\x00\x04\x10\x00\x00\x41\x00\x40\x00"
    "\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x50\x45\x41\x10\x05\x01\x00\x04\x00\x00"
    "\x40\x41\x04\x00\x05\x00\x00\x00\x00\x00\x40\x00\x00\x00\x10\x00\x00\x00\x00\x00\x40\x05"
    "\x01\x04\x04\x00\x10\x40\x00\x00\x01\x41\x00\x00\x00\x00\x00\x40\x10\x00\x00\x00\x00\x10"
    "\x00\x00\x00\x10\x00\x00\x04\x04\x40\x00\x40\x40\x00\x00\x00\x00\x01\x00\x00\x10\x40\x01"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x40\x41\x00\x00\x01\x10\x10"
    "\x00\x01\x00\x50\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x04\x00\x00\x00"
    "\x01\x00\x01\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x10\x01\x00\x00\x00\x00\x10"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"
    "\x00\x04\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x10\x10\x00\x00\x00\x40\x15\x05\x01"
    "\x15\x04\x00\x50\x00\x00\x50\x15\x01\x00\x04\x10\x04\x00\x00\x00\x00\x01\x00\x04\x00\x00"
    "\x00\x40\x01\x00\x41\x14\x54\x00\x10\x00\x40\x00\x40\x00\x00\x04\x00\x00\x00\x01\x00\x00"
    "\x00\x00\x40\x00\x00\x04\x00\x00\x00\x00\x01\x00\x00\x10\x04\x00\x04\x00\x00\x01\x14\x00"
    "\x00\x04\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x10\x04\x04\x10"
    "\x05\x01\x00\x04\x00\x01\x00\x01\x00\x00\x01\x00\x10\x00\x00\x00\x01\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x04\x00\x40\x00\x00\x44\x00\x00\x00\x41\x10\x00\x00\x00\x00\x00\x00\x00\x10"
    "\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04"
    "\x00\x00\x00\x00\x04\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x10\x00"
    "\x00\x00\x00\x45\x01\x04\x04\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x40\x10\x00\x00\x00"
    "\x40\x14\x01\x00\x10\x00\x00\x00\x01\x00\x04\x00\x00\x00\x40\x00\x00\x00\x00\x40\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x04\x00\x40\x00"
    "\x45\x00\x00\x00\x00\x00\x40\x10\x04\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x05"
    "\x00\x00\x00\x00\x01\x00\x01";

/* IQ2_S: 1024 of the 3^8 points */
static const uint8_t iq2s_lattice[] =
    "\x55\x55\x55\x51\x55\x45\x55\x15\x05\x11\x55\x55\x51\x50\x45\x55\x14\x05\x15\x14\x54\x51"
    "\x10\x50\x55\x04\x00\x11\x11\x10\x50\x55\x45\x55\x55\x55\x15\x54\x45\x51\x50\x55\x55\x14"
    "\x55\x55\x14\x54\x51\x10\x40\x55\x04\x00\x51\x14\x04\x50\x10\x00\x40\x15\x55\x11\x55\x55"
    "\x51\x10\x01\x01\x40\x05\x55\x04\x44\x51\x10\x40\x40\x00\x00\x01\x14\x10\x05\x10\x00\x00"
    "\x00\x40\x00\x54\x55\x51\x51\x45\x55\x15\x15\x51\x14\x54\x55\x55\x45\x55\x15\x05\x55\x14"
    "\x00\x50\x14\x41\x41\x04\x05\x00\x14\x04\x00\x50\x45\x55\x14\x55\x55\x14\x54\x51\x10\x40"
    "\x55\x15\x05\x55\x14\x04\x50\x10\x00\x40\x14\x05\x01\x14\x04\x00\x10\x00\x00\x40\x55\x51"
    "\x04\x54\x51\x10\x40\x01\x00\x00\x55\x14\x04\x50\x10\x00\x10\x00\x00\x04\x10\x04\x00\x10"
    "\x00\x04\x00\x00\x00\x00\x54\x51\x15\x51\x41\x05\x04\x01\x11\x00\x54\x50\x41\x40\x05\x05"
    "\x01\x14\x04\x00\x10\x10\x00\x51\x04\x01\x00\x00\x05\x00\x44\x55\x14\x05\x55\x14\x04\x50"
    "\x10\x00\x40\x14\x05\x01\x14\x04\x00\x11\x00\x00\x00\x05\x01\x00\x04\x00\x04\x00\x00\x00"
    "\x00\x11\x14\x00\x50\x10\x00\x00\x40\x00\x00\x15\x04\x00\x00\x00\x00\x00\x00\x10\x00\x00"
    "\x04\x40\x00\x00\x00\x04\x40\x01\x00\x50\x55\x55\x45\x55\x55\x15\x14\x44\x51\x50\x45\x55"
    "\x05\x55\x55\x14\x54\x51\x10\x40\x41\x15\x04\x51\x14\x04\x50\x00\x00\x40\x55\x55\x55\x54"
    "\x55\x51\x50\x45\x41\x00\x55\x55\x14\x54\x51\x10\x50\x41\x00\x00\x55\x14\x04\x50\x10\x00"
    "\x40\x00\x00\x10\x14\x55\x51\x50\x45\x41\x00\x04\x01\x00\x54\x51\x10\x40\x41\x00\x00\x01"
    "\x40\x00\x50\x10\x00\x40\x00\x00\x00\x00\x00\x00\x50\x45\x55\x15\x55\x55\x14\x54\x51\x00"
    "\x40\x55\x15\x05\x55\x14\x04\x50\x10\x00\x40\x14\x05\x01\x14\x04\x00\x14\x00\x00\x00\x55"
    "\x55\x14\x54\x51\x10\x40\x41\x00\x00\x55\x14\x04\x50\x10\x00\x40\x00\x00\x00\x14\x04\x00"
    "\x11\x00\x00\x00\x00\x00\x00\x54\x51\x10\x40\x41\x40\x00\x01\x00\x00\x50\x10\x00\x40\x00"
    "\x00\x00\x00\x00\x00\x10\x00\x10\x00\x00\x00\x00\x40\x00\x00\x44\x45\x15\x05\x51\x14\x04"
    "\x40\x10\x00\x40\x15\x05\x01\x14\x04\x00\x10\x00\x10\x00\x04\x01\x00\x04\x00\x01\x00\x00"
    "\x00\x01\x51\x14\x04\x50\x10\x00\x40\x00\x00\x00\x14\x04\x00\x10\x10\x00\x10\x00\x04\x00"
    "\x04\x00\x00\x00\x00\x00\x00\x00\x10\x00\x50\x10\x00\x00\x00\x00\x10\x00\x00\x01\x10\x00"
    "\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x40\x40\x15\x45\x11"
    "\x14\x54\x11\x10\x41\x01\x00\x45\x55\x14\x54\x51\x00\x40\x41\x00\x40\x11\x15\x00\x50\x10"
    "\x00\x00\x00\x00\x00\x54\x55\x11\x50\x45\x41\x00\x05\x01\x00\x54\x51\x10\x40\x41\x00\x00"
    "\x01\x01\x00\x50\x10\x00\x50\x00\x00\x00\x00\x00\x00\x10\x41\x01\x00\x05\x01\x00\x00\x00"
    "\x40\x40\x01\x00\x00\x01\x00\x40\x00\x00\x00\x00\x00\x00\x04\x00\x00\x05\x40\x00\x00\x01"
    "\x45\x55\x10\x54\x51\x10\x40\x41\x00\x00\x11\x14\x00\x50\x10\x10\x00\x00\x00\x00\x14\x04"
    "\x00\x10\x00\x00\x00\x00\x00\x40\x54\x51\x10\x40\x41\x00\x00\x01\x40\x00\x50\x10\x00\x40"
    "\x00\x00\x00\x00\x00\x11\x10\x00\x00\x00\x10\x00\x10\x00\x00\x00\x40\x41\x00\x10\x01\x00"
    "\x00\x00\x00\x00\x50\x00\x00\x00\x00\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x40\x00\x00\x11\x11\x10\x54\x10\x00\x00\x00\x00\x04\x01\x00\x00\x10\x00\x00\x04\x00\x00"
    "\x00\x10\x04\x40\x14\x00\x00\x00\x44\x01\x00\x51\x10\x00\x40\x00\x00\x00\x00\x01\x40\x10"
    "\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x40\x00"
    "\x40\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x40\x00\x00\x04\x00\x00\x40\x01\x14\x01"
    "\x00\x00\x00\x10\x00\x00\x01";

/* IQ3_XXS: 256 of the 8^4 points */
static const uint8_t iq3xxs_lattice[] =
    "\x15\x8a\x05\x02\x04\x00\x00\x28\x0a\x05\x22\x05\x02\x10\x00\x01\x15\x02\x05\x8a\x00\x82"
    "\x00\x20\x82\x05\x20\x00\x00\x00\x00\x01\x00\x08\x00\x80\x10\x80\x00\x28\x82\x00\x00\x04"
    "\x00\x04\x00\x00\x00\x00\x00\x20\x00\x00\x10\x00\x00\x51\x00\x00\x08\x00\x02\x00\x0a\x05"
    "\x0a\x15\x80\x01\x00\x00\x05\x02\x05\x00\x00\x00\x00\x00\x0a\x05\x02\x01\x00\x00\x00\x04"
    "\x05\x00\x01\x02\x40\x00\x40\x00\x22\x00\x00\x00\x00\x01\x00\x00\x00\x00\x11\x00\x40\x00"
    "\x00\x02\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x01\x00\x00\x00\x05\x0a\x45\x02"
    "\x04\x00\x00\x00\x2a\x05\x02\x01\x00\x00\x88\x01\x05\x82\x05\x80\x01\x20\x00\x00\x02\x11"
    "\x00\x00\x00\x00\x00\x11\x00\x00\x00\x20\x00\x08\x00\x00\x08\x00\x80\x00\x02\x00\x00\x10"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x0a\x40\x00\x00\x20\x00\x00\x00\x02\x05\x0a\x00\x00\x01"
    "\x20\x04\x05\x00\x01\x02\x50\x00\x00\x00\x0a\x01\x20\x00\x00\x04\x00\x04\x00\x02\x00\x08"
    "\x00\x00\x00\x00\x00\x00\x00\x01\x80\x00\x00\x04\x41\x00\x04\x00\x00\x20\x00\x00\x00\x10"
    "\x00\x40\x00\x00\x08\x00\x00\x00\x00\x08\x00\x00\x01\x00\x10\x80\x00\xa0\x00\x88\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x01\x80\x01\x00\x41\x00\x80\x00\x00\x00\x20\x00"
    "\x00\x00\x10\x00\x00\x00\x00\x02\x10\x00\x00\x00\x20\x00\x08\x00\x00\x01\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x20\x05\x00\x01\x00\x00\x00\x00\x00\x04\x00\x00\x02\x00\x00\x01\x41\x00"
    "\x40\x00\x00\x20\x00\x00\x00\x10\x00\x04\x00\x00\x00\x04\x04\x00\x00\x00\x00\x08\x00\x00"
    "\x00\x01\x88\x00\x00\x00\x00\x04\x04\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"
    "\x00\x00\x00\x00\x10\x00\x04\x00\x00\x00\x00\x00\x10\x00\x50\x00\x10\x00\x00\x00\x02\x00"
    "\x00\x00\x02\x00\x00\x80\x00\x00\x00\x00\x10\x00\x00\x00\x00\x41\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x10\x00\x00\x00\x20\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x08\x00\x00\x00\x00"
    "\x08\x00\x02\x00\x00\x00\x00\x00\xa8\x01\x00\x04\x00\x04\x00\x00\x00\x00\x40\x00\x01\x00"
    "\x00\x00\x00\x04\x00\x00\x20\x04\x00\x00\x01\x20\x00\x08\x00\x00\x01\x00\x00\x00\x02\x00"
    "\x02\x00\x00\x00\x05\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00";

/* IQ3_S: 512 of the 8^4 points */
static const uint8_t iq3s_lattice[] =
    "\xa7\x57\x23\x08\xa5\x0a\x05\x92\x17\x23\x89\x22\x10\x00\x22\x04\xa3\x49\x22\x11\xa4\x0a"
    "\x00\x09\x08\x22\x05\x4a\x10\x05\x80\x22\x01\x88\x12\x04\x09\x02\x00\x01\x14\x00\x45\x08"
    "\xa2\x00\x40\x08\x40\x0a\x00\x02\x00\x04\x00\x02\x15\x00\x45\x08\x00\x11\x00\x00\x17\xab"
    "\x05\x52\x00\x50\x02\x04\x4b\x11\x02\x09\x02\x05\x00\x41\x01\xa4\x11\x04\x09\x20\x01\x04"
    "\x92\x09\x82\x11\x02\x00\x04\x01\x28\x14\x00\x0a\x44\x11\x00\x00\x02\x09\x02\x05\x00\x02"
    "\x00\x00\x00\x00\x91\x00\x50\x00\x00\x00\x0a\x05\x02\x20\x02\x00\x04\x01\xab\x55\x8a\x05"
    "\x2a\x05\x80\x29\x05\x89\x24\x12\x04\x02\x00\x00\x92\x00\x0a\x81\x02\x88\x00\x12\x25\x02"
    "\x14\x0a\x04\x01\x40\x00\x82\x00\x09\x24\x02\x00\x00\x24\x10\x02\x04\x80\x01\x08\x00\x01"
    "\x85\x00\x02\x00\x00\x20\x02\x00\x20\x02\x40\x01\x08\x01\x00\x00\x04\xaa\x04\x2a\x94\x02"
    "\x08\x02\x2a\x10\x0a\x00\x01\x00\x01\x44\x01\x04\x01\x14\x00\x01\x00\x00\x02\x11\x8a\x01"
    "\x8a\x20\x00\x08\x08\x42\x04\x02\x00\x04\x11\x00\x02\x05\x20\x04\x10\x40\x00\x08\x00\x40"
    "\x00\x00\x02\x00\x00\x00\x0a\x00\x05\x20\x00\x00\x00\x00\x11\x04\x91\x04\x02\x01\x00\x01"
    "\x84\x0a\x04\x21\x08\x22\x00\x00\x0a\x21\x02\x08\x01\x80\x04\x01\x10\x0a\x05\x22\x00\x00"
    "\x00\x00\x05\x00\x10\x80\x01\x00\x00\x02\xa0\x00\x02\x00\x00\x00\x04\x00\x00\x08\x00\x10"
    "\x00\x00\x01\x00\x00\x21\x00\x01\x08\x02\x00\x00\x04\x11\x04\x00\x91\x04\x40\x10\x2a\x04"
    "\x02\x04\x00\x00\x00\x04\x01\x02\x08\x41\x00\x08\x00\x00\x84\x01\x80\x00\x10\x02\x20\x08"
    "\x12\x00\x01\x04\x40\x00\x00\x00\x00\x04\x40\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x04\x00"
    "\x00\x00\x14\x00\x04\x00\x00\x00\x00\x00\x00\x2a\x00\x0a\x00\x00\x01\x00\x01\x00\x81\x00"
    "\x00\x00\x10\x00\x00\x04\x00\x10\x04\x20\x04\x01\x01\x10\x02\x00\x01\x00\x00\x00\x00\x00"
    "\x20\x00\x08\x00\x04\x00\x09\x00\x00\x10\x00\x00\x01\x00\x20\x00\x00\x00\x01\x00\x00\x00"
    "\x00\x0a\x00\x00\x00\x00\x00\x00\x91\x00\x05\x40\x01\x10\x04\x00\x04\x02\x10\x00\x28\x00"
    "\x00\x00\x12\x41\x02\x01\x00\x02\x00\x00\x04\x00\x00\x24\x00\x08\x00\x00\x22\x08\x01\x00"
    "\x00\x01\x00\x00\x00\x00\x04\x00\x04\x00\x00\x00\x04\x00\x00\x02\x00\x00\x00\x00\x01\x00"
    "\x00\x00\x00\x00\x00\x00";

/* IQ1_S and IQ1_M: 2048 of the 3^8 points */
static const uint8_t iq1s_lattice[] =
    "\x55\x25\x14\x85\xa0\x02\x42\x51\x08\x45\x31\xa8\x86\x20\x8a\xa2\x1a\x08\x2a\x20\x14\x85"
    "\x50\x14\x82\x20\x44\x45\x25\x15\x05\xa0\x02\x82\x20\x88\x18\x00\x08\x82\xa0\x03\x2a\xa0"
    "\x88\xbb\xaa\x0a\x90\xaa\x0b\x00\x22\x00\x0a\xaa\x8c\x82\xa0\x08\x40\x51\x08\x45\x21\x88"
    "\x80\x50\x14\x42\x51\x08\x8a\x30\x08\x98\xa0\x08\x80\x2a\x08\x45\x21\x14\x85\x20\x48\x42"
    "\x55\x08\x45\x01\x2c\xc2\xa0\x20\x8a\x26\x00\x2a\x24\xa8\xaa\xa2\x08\xe2\xaf\x08\x08\x28"
    "\x28\x00\xa0\x02\x42\x28\xaa\x28\x20\xa8\x80\x20\x0a\x9b\x08\xb9\xba\xa8\x20\xca\xae\x89"
    "\xa2\xae\xaa\x3a\x7c\xeb\xea\xba\xbb\x82\x0e\xb8\x22\xba\xca\xd3\x0e\x92\x02\x22\x00\x22"
    "\x20\xa8\x8a\xba\x0a\x82\x02\x08\x00\x2a\x4a\xe0\xa2\x3b\x22\x20\x2b\xa2\x00\x81\x40\x81"
    "\xaa\x8a\x28\x08\x22\x01\x14\x85\x50\x15\x82\x20\x09\x45\x21\x54\x85\xa0\x08\x02\x23\xa8"
    "\x3a\x20\x84\x82\x20\x54\x42\x51\x08\xa2\x20\x08\x95\x50\x14\x02\x2a\x08\xb8\xa8\x82\x80"
    "\xa0\x48\x02\x20\x08\x82\xa2\x68\xa2\x02\x28\xab\x2a\x08\x85\x20\x08\x82\x30\x08\x45\x40"
    "\x00\x45\x21\x14\x85\xa0\x00\x42\x51\x00\x45\x01\x29\x82\x00\x8a\x82\x2a\x08\xa1\x30\x14"
    "\x05\x50\x14\x82\x28\x08\x45\x21\x14\x85\x20\x02\x02\x20\xaa\x2a\x00\x20\x12\xb1\x8a\xae"
    "\x28\xa8\xba\xa1\xaa\xa8\x70\x00\x82\x0a\x08\x02\x28\x22\x02\x84\x00\x82\x00\x48\x80\xa0"
    "\xea\xb0\x2a\xaa\xc2\x20\x8b\xba\x22\xea\xda\xa7\x8b\x8b\x6e\xa8\x92\xb0\x2a\xaa\x72\x8b"
    "\x8a\x44\x0c\x2a\x20\x48\x84\x40\x28\x8a\x2a\x08\xaa\x20\xc8\xcc\xa2\x22\xa2\xaf\x9a\xa0"
    "\xe8\xa8\x02\x00\x02\x00\x2a\xa8\x88\x00\x20\x80\xa0\x8b\xa2\xa2\x28\xba\xa0\x80\x82\x32"
    "\x0a\xba\xbe\xb8\xba\xfe\xeb\xa2\xa0\x2b\xa2\x08\x8a\x0a\x28\xea\xa2\x00\xa1\x32\x02\x0c"
    "\xfa\xa4\xea\xde\xef\x2b\xa8\x2e\x8d\xbe\x7e\xeb\xfa\xf7\x7f\xbf\xe6\x7d\xba\xde\x69\xfb"
    "\x27\xff\xbf\x26\xfa\x12\xe9\xe1\x8a\x22\x10\xaa\xbe\x0e\x84\xaa\x08\xb2\xa8\x0b\x82\xae"
    "\xff\xba\x24\xe9\x83\x80\x04\x62\x2c\x68\xf2\xa8\x0a\xa4\x2b\x00\x02\x2a\x08\x08\xe2\xaa"
    "\x12\x00\x02\x82\x2a\x0a\xa6\x20\xc9\x82\x89\x90\x82\x28\x00\xa2\x00\x8c\x80\x13\x00\x82"
    "\x08\x08\x00\x6c\x8a\xaa\xaa\xbb\x02\xa6\xbe\x8a\xa0\xca\x02\x80\x6b\x97\x2e\xd0\xb2\xe9"
    "\x10\x82\x10\x2e\xaa\xde\x28\x15\xd1\xa5\x04\x00\x0a\x82\x00\x8a\x82\x20\x08\x01\xa1\x20"
    "\x82\xaa\x39\xba\x22\x32\x84\xa0\x09\x80\x18\x00\x8a\xa2\x62\x02\x81\x14\x44\x51\x00\x45"
    "\x21\xac\x82\x50\x14\x42\x51\x08\xaa\x20\x28\xaa\x87\x0a\x12\x2a\x08\x45\x21\x14\x05\xa0"
    "\x08\x42\x51\x08\x45\x01\x20\x02\xa0\x40\xa2\x22\x00\x88\x00\x08\xa2\x08\x6a\x8a\x6e\xb8"
    "\xaa\xaa\x80\x00\x20\x0a\x82\xe2\xc8\x22\x21\x08\x44\x50\x14\x42\x51\x09\x8a\x20\x15\x85"
    "\x50\x14\x86\x0a\x08\xaa\x2a\x2a\x80\x00\x0a\x42\x51\x08\x45\x21\xa8\x00\x50\x14\x42\x51"
    "\x08\xe2\x20\x88\x82\x0a\x18\x82\x2a\x08\xaa\xa2\xaa\x8a\xb0\x8b\x02\x0a\x2a\xaa\x20\x28"
    "\x82\x80\xaa\x0a\x28\x08\x28\x00\xa9\x88\x02\x22\xa0\xbe\x0b\x28\xb8\x08\x8a\xba\x4b\xb2"
    "\xae\xff\xba\xa4\xf8\xae\xaa\x20\x52\x28\x68\xb6\xa0\x30\xe6\x80\x0a\x02\x28\x08\x22\x6a"
    "\x62\x80\x20\x0a\x02\xaa\xaa\x2b\xaa\xea\xa2\xa9\xa0\xa2\x08\x08\x10\x20\xa0\x8a\x22\x00"
    "\x82\x0e\x00\x45\x21\x14\x85\xa0\x0a\x40\x51\x08\x45\x21\xa9\x06\x00\x4a\xaa\x02\x08\xa5"
    "\x00\x10\x0d\x44\x14\x82\x28\x08\x45\x21\x14\x05\x00\x08\x82\x82\xac\xf2\x20\x00\x00\x00"
    "\xaa\x0a\x28\x0a\xba\x20\xea\xa2\x02\x00\x82\x48\x09\x28\xe9\x14\x00\x11\x4b\x45\x51\x00"
    "\x45\x01\xa8\x02\x50\x14\x42\x51\x08\x88\x24\x08\x88\x28\x0a\x40\x08\x00\x45\x01\x14\x05"
    "\xa0\x02\x40\x51\x08\x45\x01";
typedef struct iq_codebook {
    const uint8_t *lattice; /* (n_levels^dim bits) which lattice points are entries */
    int dim;                /* values per entry: 8, or 4 (two entries a group) */
    int n_levels;
    int8_t levels[8]; /* (n_levels) ascending */
    int n_entries;
} iq_codebook;

enum { CB_IQ2XXS, CB_IQ2XS, CB_IQ2S, CB_IQ3XXS, CB_IQ3S, CB_IQ1S, CB_COUNT };

#define IQ_LATTICE_MAX 6561 /* 3^8; 8^4 is 4096 */

static const iq_codebook codebooks[CB_COUNT] = {
    [CB_IQ2XXS] = {iq2xxs_lattice, 8, 3, {8, 25, 43}, 256},
    [CB_IQ2XS] = {iq2xs_lattice, 8, 3, {8, 25, 43}, 512},
    [CB_IQ2S] = {iq2s_lattice, 8, 3, {8, 25, 43}, 1024},
    [CB_IQ3XXS] = {iq3xxs_lattice, 4, 8, {4, 12, 20, 28, 36, 44, 52, 62}, 256},
    [CB_IQ3S] = {iq3s_lattice, 4, 8, {1, 3, 5, 7, 9, 11, 13, 15}, 512},
    [CB_IQ1S] = {iq1s_lattice, 8, 3, {-1, 0, 1}, 2048},
};

static quant_iq_tables grid;
static pthread_once_t grid_once = PTHREAD_ONCE_INIT;

static int lattice_points(const iq_codebook *cb)
{
    int n = 1;
    for (int j = 0; j < cb->dim; j++)
        n *= cb->n_levels;
    return n;
}

/* Lattice point i's values as bytes, value j in byte j. */
static uint64_t lattice_point(const iq_codebook *cb, int i)
{
    uint64_t v = 0;
    for (int j = 0; j < cb->dim; j++, i /= cb->n_levels)
        v |= (uint64_t)(uint8_t)cb->levels[i % cb->n_levels] << (8 * j);
    return v;
}

static void expand_codebook(const iq_codebook *cb, uint64_t *out8, uint32_t *out4)
{
    int k = 0, n = lattice_points(cb);
    for (int i = 0; i < n && k < cb->n_entries; i++) {
        if (!((cb->lattice[i >> 3] >> (i & 7)) & 1))
            continue;
        if (out8)
            out8[k++] = lattice_point(cb, i);
        else
            out4[k++] = (uint32_t)lattice_point(cb, i);
    }
}

static void grid_init(void)
{
    expand_codebook(&codebooks[CB_IQ2XXS], grid.iq2xxs, NULL);
    expand_codebook(&codebooks[CB_IQ2XS], grid.iq2xs, NULL);
    expand_codebook(&codebooks[CB_IQ2S], grid.iq2s, NULL);
    expand_codebook(&codebooks[CB_IQ3XXS], NULL, grid.iq3xxs);
    expand_codebook(&codebooks[CB_IQ3S], NULL, grid.iq3s);
    expand_codebook(&codebooks[CB_IQ1S], grid.iq1s, NULL);
    for (int s = 0; s < 256; s++) {
        uint64_t m = 0;
        for (int j = 0; j < 8; j++)
            m |= (uint64_t)((s >> j) & 1 ? 0xff : 0x01) << (8 * j);
        grid.signs[s] = m;
    }
    /* a 7-bit pattern's eighth sign makes the count of negatives even */
    for (int s = 0; s < 128; s++)
        grid.even_signs[s] = grid.signs[s | (__builtin_parity((unsigned)s) << 7)];
}

const quant_iq_tables *quant_iq_tables_get(void)
{
    pthread_once(&grid_once, grid_init);
    return &grid;
}

/* Entry k of codebook cb as 8 (or 4) signed bytes. */
static const int8_t *entry_values(int cb, int k)
{
    switch (cb) {
    case CB_IQ2XXS:
        return (const int8_t *)&grid.iq2xxs[k];
    case CB_IQ2XS:
        return (const int8_t *)&grid.iq2xs[k];
    case CB_IQ2S:
        return (const int8_t *)&grid.iq2s[k];
    case CB_IQ3XXS:
        return (const int8_t *)&grid.iq3xxs[k];
    case CB_IQ3S:
        return (const int8_t *)&grid.iq3s[k];
    default:
        return (const int8_t *)&grid.iq1s[k];
    }
}

bool quant_iq_type(uint32_t t)
{
    switch (t) {
    case QTYPE_IQ2_XXS:
    case QTYPE_IQ2_XS:
    case QTYPE_IQ2_S:
    case QTYPE_IQ3_XXS:
    case QTYPE_IQ3_S:
    case QTYPE_IQ1_S:
    case QTYPE_IQ1_M:
        return true;
    default:
        return false;
    }
}

/* ---- unpacking ---- */

static uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint16_t load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Stores 8 magnitudes (bytes of 1 .. 62, so no byte carries into the next) times the
 * signs (+-1 bytes from grid.signs or grid.even_signs), as group g of b. */
static void put_group(iq_block *b, int g, uint64_t magnitudes, uint64_t signs)
{
    uint64_t ones = 0x0101010101010101ull, m = signs ^ ones; /* 0xfe where negative */
    m |= (m >> 1) & ones;                                     /* 0xff */
    uint64_t v = (magnitudes ^ m) + (m & ones);
    memcpy(b->q + 8 * g, &v, 8);
}

/* Two entries of 4 values as one group's 8 magnitudes. */
static uint64_t pair(uint32_t lo, uint32_t hi)
{
    return lo | (uint64_t)hi << 32;
}

static void unpack_iq2_xxs(const qblock_iq2_xxs *x, iq_block *b)
{
    b->d = qb_f16_to_f32(x->d);
    for (int k = 0; k < 8; k++) {
        uint32_t entries = load_u32(x->qs + 8 * k), aux = load_u32(x->qs + 8 * k + 4);
        b->scale[2 * k] = b->scale[2 * k + 1] = (uint8_t)(aux >> 28);
        for (int l = 0; l < 4; l++)
            put_group(b, 4 * k + l, grid.iq2xxs[(entries >> (8 * l)) & 0xff],
                      grid.even_signs[(aux >> (7 * l)) & 127]);
    }
}

/* IQ2_XS's and IQ2_S's scales: a nibble per 16 values, the low one first. */
static void unpack_nibble_scales(const uint8_t scales[8], iq_block *b)
{
    for (int k = 0; k < 8; k++) {
        b->scale[2 * k] = scales[k] & 0xf;
        b->scale[2 * k + 1] = scales[k] >> 4;
    }
}

static void unpack_iq2_xs(const qblock_iq2_xs *x, iq_block *b)
{
    b->d = qb_f16_to_f32(x->d);
    for (int g = 0; g < 32; g++) {
        unsigned w = load_u16(x->qs + 2 * g);
        put_group(b, g, grid.iq2xs[w & 511], grid.even_signs[w >> 9]);
    }
    unpack_nibble_scales(x->scales, b);
}

static void unpack_iq2_s(const qblock_iq2_s *x, iq_block *b)
{
    b->d = qb_f16_to_f32(x->d);
    for (int g = 0; g < 32; g++) {
        int k = g / 4, l = g % 4;
        unsigned e = x->qs[g] | ((x->qh[k] >> (2 * l)) & 3u) << 8;
        put_group(b, g, grid.iq2s[e], grid.signs[x->signs[g]]);
    }
    unpack_nibble_scales(x->scales, b);
}

static void unpack_iq3_xxs(const qblock_iq3_xxs *x, iq_block *b)
{
    b->d = qb_f16_to_f32(x->d);
    for (int k = 0; k < 8; k++) {
        uint32_t aux = load_u32(x->scales_signs + 4 * k);
        b->scale[2 * k] = b->scale[2 * k + 1] = (uint8_t)(aux >> 28);
        for (int l = 0; l < 4; l++) {
            const uint8_t *e = x->qs + 8 * k + 2 * l;
            put_group(b, 4 * k + l, pair(grid.iq3xxs[e[0]], grid.iq3xxs[e[1]]),
                      grid.even_signs[(aux >> (7 * l)) & 127]);
        }
    }
}

static void unpack_iq3_s(const qblock_iq3_s *x, iq_block *b)
{
    b->d = qb_f16_to_f32(x->d);
    for (int g = 0; g < 32; g++) {
        int k = g / 4, l = g % 4;
        unsigned e0 = x->qs[2 * g] | ((x->qh[k] >> (2 * l)) & 1u) << 8;
        unsigned e1 = x->qs[2 * g + 1] | ((x->qh[k] >> (2 * l + 1)) & 1u) << 8;
        put_group(b, g, pair(grid.iq3s[e0], grid.iq3s[e1]), grid.signs[x->signs[g]]);
    }
    for (int k = 0; k < 8; k++)
        b->scale[2 * k] = b->scale[2 * k + 1] = (x->scales[k / 2] >> (4 * (k % 2))) & 0xf;
}

static void unpack_iq1_s(const qblock_iq1_s *x, iq_block *b)
{
    b->d = qb_f16_to_f32(x->d);
    for (int k = 0; k < 8; k++) {
        unsigned h = load_u16(x->qh + 2 * k);
        b->scale[2 * k] = b->scale[2 * k + 1] = (h >> 12) & 7;
        for (int l = 0; l < 4; l++) {
            int g = 4 * k + l;
            memcpy(b->q + 8 * g, &grid.iq1s[x->qs[g] | ((h >> (3 * l)) & 7u) << 8], 8);
            b->delta[g] = h & 0x8000 ? -1 : 1;
        }
    }
}

static void unpack_iq1_m(const qblock_iq1_m *x, iq_block *b)
{
    b->d = quant_iq_d(QTYPE_IQ1_M, x);
    for (int k = 0; k < 8; k++) {
        unsigned w = load_u16(x->scales + 2 * (k / 2)) >> (6 * (k % 2));
        b->scale[2 * k] = w & 7;
        b->scale[2 * k + 1] = (w >> 3) & 7;
        for (int l = 0; l < 4; l++) {
            int g = 4 * k + l;
            unsigned nib = (x->qh[2 * k + l / 2] >> (4 * (l % 2))) & 0xf;
            memcpy(b->q + 8 * g, &grid.iq1s[x->qs[g] | (nib & 7) << 8], 8);
            b->delta[g] = nib & 8 ? -1 : 1;
        }
    }
}

void quant_iq_unpack(uint32_t t, const void *block, iq_block *b)
{
    pthread_once(&grid_once, grid_init);
    memset(b->delta, 0, sizeof b->delta);
    switch (t) {
    case QTYPE_IQ2_XXS:
        unpack_iq2_xxs(block, b);
        break;
    case QTYPE_IQ2_XS:
        unpack_iq2_xs(block, b);
        break;
    case QTYPE_IQ2_S:
        unpack_iq2_s(block, b);
        break;
    case QTYPE_IQ3_XXS:
        unpack_iq3_xxs(block, b);
        break;
    case QTYPE_IQ3_S:
        unpack_iq3_s(block, b);
        break;
    case QTYPE_IQ1_S:
        unpack_iq1_s(block, b);
        break;
    case QTYPE_IQ1_M:
        unpack_iq1_m(block, b);
        break;
    default:
        memset(b, 0, sizeof *b);
        break;
    }
}

/* ---- scalar kernels ---- */

static bool iq1(uint32_t t)
{
    return t == QTYPE_IQ1_S || t == QTYPE_IQ1_M;
}

/* The step of scale field s under super-block scale d, in llama.cpp's arithmetic. */
static float iq_step(uint32_t t, float d, int s)
{
    switch (t) {
    case QTYPE_IQ2_XXS:
    case QTYPE_IQ2_XS:
    case QTYPE_IQ2_S:
        return d * (0.5f + (float)s) * 0.25f;
    case QTYPE_IQ3_XXS:
        return d * (0.5f + (float)s) * 0.5f;
    default: /* IQ3_S, IQ1_S, IQ1_M */
        return d * (float)(2 * s + 1);
    }
}

void quant_iq_dequantize(uint32_t t, const void *src, float *dst, int64_t nb)
{
    size_t bytes = quant_traits_of(t)->block_bytes;
    iq_block b;
    for (int64_t i = 0; i < nb; i++, dst += QB_256) {
        quant_iq_unpack(t, (const uint8_t *)src + (size_t)i * bytes, &b);
        for (int k = 0; k < 16; k++) {
            float step = iq_step(t, b.d, b.scale[k]);
            for (int j = 16 * k; j < 16 * k + 16; j++)
                dst[j] = iq1(t) ? step * ((float)b.q[j] + 0.125f * (float)b.delta[j / 8])
                                : step * (float)b.q[j];
        }
    }
}

float quant_iq_row_factor(uint32_t t)
{
    switch (t) {
    case QTYPE_IQ2_XXS:
    case QTYPE_IQ2_XS:
    case QTYPE_IQ2_S:
        return 0.125f;
    case QTYPE_IQ3_XXS:
        return 0.25f;
    default:
        return 1.0f;
    }
}

float quant_iq_dot(uint32_t t, const void *x, const qblock_q8_k *y, int64_t nb)
{
    size_t bytes = quant_traits_of(t)->block_bytes;
    iq_block b;
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        quant_iq_unpack(t, (const uint8_t *)x + (size_t)i * bytes, &b);
        int32_t sumi = 0, shifted = 0;
        for (int k = 0; k < 16; k++) {
            int32_t s = 0, a = 0;
            for (int j = 16 * k; j < 16 * k + 16; j++) {
                s += b.q[j] * y[i].qs[j];
                a += b.delta[j / 8] * y[i].qs[j];
            }
            sumi += (2 * b.scale[k] + 1) * s;
            shifted += (2 * b.scale[k] + 1) * a;
        }
        sum += quant_iq_block_sum(t, b.d, y[i].d, sumi, shifted);
    }
    return quant_iq_row_factor(t) * sum;
}

/* ---- the reference quantizer ---- */

enum iq_signs {
    SIGNS_NONE, /* IQ1: the entries carry their signs */
    SIGNS_EVEN, /* 7 bits stored, the count of negatives even */
    SIGNS_FREE, /* 8 bits stored */
};

/* How a type spends its bits, as far as the quantizer needs to know. */
typedef struct iq_format {
    int codebook;      /* CB_* */
    int scale_elems;   /* elements sharing a scale field: 16 or 32 */
    int scale_max;     /* the largest scale field */
    enum iq_signs signs;
    int shift_elems;   /* IQ1: elements sharing a shift (8 or 32); 0 for the others */
} iq_format;

static const iq_format *iq_format_of(uint32_t t)
{
    static const iq_format iq2_xxs = {CB_IQ2XXS, 32, 15, SIGNS_EVEN, 0},
                           iq2_xs = {CB_IQ2XS, 16, 15, SIGNS_EVEN, 0},
                           iq2_s = {CB_IQ2S, 16, 15, SIGNS_FREE, 0},
                           iq3_xxs = {CB_IQ3XXS, 32, 15, SIGNS_EVEN, 0},
                           iq3_s = {CB_IQ3S, 32, 15, SIGNS_FREE, 0},
                           iq1_s = {CB_IQ1S, 32, 7, SIGNS_NONE, 32},
                           iq1_m = {CB_IQ1S, 16, 7, SIGNS_NONE, 8};
    switch (t) {
    case QTYPE_IQ2_XXS:
        return &iq2_xxs;
    case QTYPE_IQ2_XS:
        return &iq2_xs;
    case QTYPE_IQ2_S:
        return &iq2_s;
    case QTYPE_IQ3_XXS:
        return &iq3_xxs;
    case QTYPE_IQ3_S:
        return &iq3_s;
    case QTYPE_IQ1_S:
        return &iq1_s;
    default:
        return &iq1_m;
    }
}

/* For every lattice point of every codebook, the IQ_NEAR entries nearest it: a group's
 * entry is searched among those of the lattice point its values round to. */
#define IQ_NEAR 6
static int16_t nearest_of[CB_COUNT][IQ_LATTICE_MAX][IQ_NEAR];
/* The midpoints between each codebook's adjacent levels (half-integers, exact in f32): a
 * value rounds to the level above each midpoint it exceeds, to the lower one on a tie. */
static float level_midpoint[CB_COUNT][7];
/* Every codebook's entries as floats, codebook c's from entry_f32_start[c] on: the search
 * measures its distances in f32 without converting bytes. */
#define IQ_ENTRY_VALUES (8 * (256 + 512 + 1024 + 2048) + 4 * (256 + 512))
static float entry_f32[IQ_ENTRY_VALUES];
static int entry_f32_start[CB_COUNT];
static pthread_once_t nearest_once = PTHREAD_ONCE_INIT;

static const float *entry_floats(int c, int k)
{
    return entry_f32 + entry_f32_start[c] + codebooks[c].dim * k;
}

static void nearest_init(void)
{
    pthread_once(&grid_once, grid_init);
    for (int c = 0, start = 0; c < CB_COUNT; c++) {
        const iq_codebook *cb = &codebooks[c];
        for (int l = 0; l + 1 < cb->n_levels; l++)
            level_midpoint[c][l] = 0.5f * (float)(cb->levels[l] + cb->levels[l + 1]);
        entry_f32_start[c] = start;
        for (int k = 0; k < cb->n_entries; k++)
            for (int j = 0; j < cb->dim; j++)
                entry_f32[start + cb->dim * k + j] = entry_values(c, k)[j];
        start += cb->dim * cb->n_entries;
        int n = lattice_points(cb);
        for (int i = 0; i < n; i++) {
            uint64_t p = lattice_point(cb, i);
            int dist[IQ_NEAR];
            int16_t *near = nearest_of[c][i];
            for (int m = 0; m < IQ_NEAR; m++)
                dist[m] = INT32_MAX, near[m] = 0;
            for (int k = 0; k < cb->n_entries; k++) {
                const int8_t *e = entry_values(c, k);
                int d2 = 0;
                for (int j = 0; j < cb->dim; j++) {
                    int diff = (int8_t)(p >> (8 * j)) - e[j];
                    d2 += diff * diff;
                }
                int m = IQ_NEAR;
                while (m > 0 && d2 < dist[m - 1]) {
                    if (m < IQ_NEAR)
                        dist[m] = dist[m - 1], near[m] = near[m - 1];
                    m--;
                }
                if (m < IQ_NEAR)
                    dist[m] = d2, near[m] = (int16_t)k;
            }
        }
    }
}

/* The entry of codebook c nearest the dim values t (in grid units); its values into v. */
static int nearest_entry(int c, const float *t, float *v)
{
    const iq_codebook *cb = &codebooks[c];
    int point = 0, place = 1;
    for (int j = 0; j < cb->dim; j++, place *= cb->n_levels) {
        int level = 0;
        for (int l = 0; l + 1 < cb->n_levels; l++)
            level += t[j] > level_midpoint[c][l];
        point += level * place;
    }
    int best = nearest_of[c][point][0];
    float best_err = FLT_MAX;
    for (int m = 0; m < IQ_NEAR; m++) {
        const float *e = entry_floats(c, nearest_of[c][point][m]);
        float err = 0;
        for (int j = 0; j < cb->dim; j++)
            err += (t[j] - e[j]) * (t[j] - e[j]);
        if (err < best_err) {
            best_err = err;
            best = nearest_of[c][point][m];
        }
    }
    const float *e = entry_floats(c, best);
    for (int j = 0; j < cb->dim; j++)
        v[j] = e[j];
    return best;
}

/* A super-block's choices, before packing. */
typedef struct iq_choice {
    uint16_t entry[64]; /* (32 groups, 8 / dim) each group's entries */
    uint8_t signs[32];  /* (32) each group's sign bits, bit j for value j */
    int8_t shift[32];   /* (32) IQ1: each group's shift in eighths, +1 or -1 */
    uint8_t scale[16];  /* (16) the scale field of each 16 values */
    uint16_t d;         /* f16 */
} iq_choice;

/* Group g's choice for its 8 values x at grid step `step` (and, for IQ1, shift `shift`):
 * its entries and signs into c, each value in grid units (sign and shift in) into w;
 * returns the squared error. */
static double quantize_group(const iq_format *f, const float *x, float step, int shift,
                             iq_choice *c, int g, float w[8])
{
    const iq_codebook *cb = &codebooks[f->codebook];
    float t[8];
    unsigned neg = 0;
    for (int j = 0; j < 8; j++) {
        if (f->signs == SIGNS_NONE) {
            t[j] = x[j] / step - 0.125f * (float)shift;
        } else {
            t[j] = fabsf(x[j]) / step;
            neg |= (unsigned)(x[j] < 0) << j;
        }
    }
    if (f->signs == SIGNS_EVEN && (__builtin_popcount(neg) & 1)) {
        /* an odd count cannot be stored: the smallest value takes the wrong sign and,
         * aiming below zero, the smallest magnitude */
        int m = 0;
        for (int j = 1; j < 8; j++)
            if (fabsf(x[j]) < fabsf(x[m]))
                m = j;
        neg ^= 1u << m;
        t[m] = -t[m];
    }
    for (int h = 0; h < 8 / cb->dim; h++)
        c->entry[(8 / cb->dim) * g + h] =
            (uint16_t)nearest_entry(f->codebook, t + cb->dim * h, w + cb->dim * h);
    c->signs[g] = (uint8_t)neg;
    c->shift[g] = (int8_t)shift;
    double err = 0;
    for (int j = 0; j < 8; j++) {
        if (f->signs == SIGNS_NONE)
            w[j] += 0.125f * (float)shift;
        else if ((neg >> j) & 1)
            w[j] = -w[j];
        double e = x[j] - step * w[j];
        err += e * e;
    }
    return err;
}

/* The groups of the n values at x (a unit sharing a scale field, groups g0 ..) at grid
 * step `step`, IQ1's shifts chosen per group or per unit as the type stores them; w gets
 * the values in grid units. Returns the squared error. */
static double quantize_unit(const iq_format *f, const float *x, int n, float step, iq_choice *c,
                            int g0, float *w)
{
    double err = 0;
    if (f->signs != SIGNS_NONE) {
        for (int g = 0; g < n / 8; g++)
            err += quantize_group(f, x + 8 * g, step, 0, c, g0 + g, w + 8 * g);
        return err;
    }
    for (int g = 0; g < n / 8; g += f->shift_elems / 8) {
        int span = f->shift_elems / 8;
        double e_up = 0, e_down = 0;
        for (int h = g; h < g + span; h++)
            e_down += quantize_group(f, x + 8 * h, step, -1, c, g0 + h, w + 8 * h);
        for (int h = g; h < g + span; h++)
            e_up += quantize_group(f, x + 8 * h, step, 1, c, g0 + h, w + 8 * h);
        if (e_down < e_up)
            for (int h = g; h < g + span; h++)
                quantize_group(f, x + 8 * h, step, -1, c, g0 + h, w + 8 * h);
        err += e_down < e_up ? e_down : e_up;
    }
    return err;
}

/* The grid step that fits a unit's n values best: steps around the one that puts the
 * largest value on the largest level, and those that put it on each lower level (a row of
 * equal values wants the smallest), each refined by least squares on its choices. */
static float fit_unit_step(const iq_format *f, const float *x, int n, iq_choice *scratch)
{
    const iq_codebook *cb = &codebooks[f->codebook];
    float amax = 0, w[32];
    for (int j = 0; j < n; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    if (amax == 0)
        return 0;
    float shift = f->signs == SIGNS_NONE ? 0.125f : 0.0f;
    float top = (float)cb->levels[cb->n_levels - 1] + shift;
    float best = amax / top;
    double best_err = DBL_MAX;
    for (int i = 0; i < 16 + cb->n_levels - 1; i++) {
        float step = i < 16 ? amax / top * (0.6f + 0.05f * (float)i)
                            : amax / (fabsf((float)cb->levels[i - 16]) + shift);
        double err = quantize_unit(f, x, n, step, scratch, 0, w), sxw = 0, sww = 0;
        if (err < best_err)
            best_err = err, best = step;
        for (int j = 0; j < n; j++)
            sxw += x[j] * w[j], sww += w[j] * w[j];
        if (sww <= 0 || sxw <= 0)
            continue;
        float fitted = (float)(sxw / sww);
        double fitted_err = 0;
        for (int j = 0; j < n; j++)
            fitted_err += (x[j] - fitted * w[j]) * (x[j] - fitted * w[j]);
        if (fitted_err < best_err)
            best_err = fitted_err, best = fitted;
    }
    return best;
}

static void quantize_super_block(uint32_t t, const float *x, iq_choice *c)
{
    const iq_format *f = iq_format_of(t);
    int se = f->scale_elems, n_units = QB_256 / se;
    float step[16], largest = 0, w[32];
    iq_choice scratch;
    for (int u = 0; u < n_units; u++) {
        step[u] = fit_unit_step(f, x + se * u, se, &scratch);
        largest = fmaxf(largest, step[u]);
    }
    /* the largest step is the largest scale field's */
    c->d = quant_f32_to_f16(largest / iq_step(t, 1.0f, f->scale_max));
    float d = qb_f16_to_f32(c->d);
    for (int u = 0; u < n_units; u++) {
        int s = 0;
        for (int k = 1; k <= f->scale_max; k++)
            if (fabsf(iq_step(t, d, k) - step[u]) < fabsf(iq_step(t, d, s) - step[u]))
                s = k;
        for (int k = se / 16 * u; k < se / 16 * (u + 1); k++)
            c->scale[k] = (uint8_t)s;
        float stored = iq_step(t, d, s);
        quantize_unit(f, x + se * u, se, stored > 0 ? stored : 1.0f, c, se / 8 * u, w);
    }
}

static void store_u16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, sizeof v);
}

static void store_u32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

/* A 32-value sub-block's 7-bit sign patterns and scale, as IQ2_XXS and IQ3_XXS keep them. */
static uint32_t signs_and_scale(const iq_choice *c, int k)
{
    uint32_t aux = (uint32_t)c->scale[2 * k] << 28;
    for (int l = 0; l < 4; l++)
        aux |= (uint32_t)(c->signs[4 * k + l] & 127) << (7 * l);
    return aux;
}

static void pack(uint32_t t, const iq_choice *c, void *block)
{
    switch (t) {
    case QTYPE_IQ2_XXS: {
        qblock_iq2_xxs *x = block;
        x->d = c->d;
        for (int k = 0; k < 8; k++) {
            for (int l = 0; l < 4; l++)
                x->qs[8 * k + l] = (uint8_t)c->entry[4 * k + l];
            store_u32(x->qs + 8 * k + 4, signs_and_scale(c, k));
        }
        break;
    }
    case QTYPE_IQ2_XS: {
        qblock_iq2_xs *x = block;
        x->d = c->d;
        for (int g = 0; g < 32; g++)
            store_u16(x->qs + 2 * g, (uint16_t)(c->entry[g] | (c->signs[g] & 127) << 9));
        for (int k = 0; k < 8; k++)
            x->scales[k] = (uint8_t)(c->scale[2 * k] | c->scale[2 * k + 1] << 4);
        break;
    }
    case QTYPE_IQ2_S: {
        qblock_iq2_s *x = block;
        x->d = c->d;
        memset(x->qh, 0, sizeof x->qh);
        for (int g = 0; g < 32; g++) {
            x->qs[g] = (uint8_t)c->entry[g];
            x->qh[g / 4] |= (uint8_t)((c->entry[g] >> 8) << (2 * (g % 4)));
            x->signs[g] = c->signs[g];
        }
        for (int k = 0; k < 8; k++)
            x->scales[k] = (uint8_t)(c->scale[2 * k] | c->scale[2 * k + 1] << 4);
        break;
    }
    case QTYPE_IQ3_XXS: {
        qblock_iq3_xxs *x = block;
        x->d = c->d;
        for (int e = 0; e < 64; e++)
            x->qs[e] = (uint8_t)c->entry[e];
        for (int k = 0; k < 8; k++)
            store_u32(x->scales_signs + 4 * k, signs_and_scale(c, k));
        break;
    }
    case QTYPE_IQ3_S: {
        qblock_iq3_s *x = block;
        x->d = c->d;
        memset(x->qh, 0, sizeof x->qh);
        memset(x->scales, 0, sizeof x->scales);
        for (int g = 0; g < 32; g++) {
            for (int h = 0; h < 2; h++) {
                x->qs[2 * g + h] = (uint8_t)c->entry[2 * g + h];
                x->qh[g / 4] |= (uint8_t)((c->entry[2 * g + h] >> 8) << (2 * (g % 4) + h));
            }
            x->signs[g] = c->signs[g];
        }
        for (int k = 0; k < 8; k++)
            x->scales[k / 2] |= (uint8_t)(c->scale[2 * k] << (4 * (k % 2)));
        break;
    }
    case QTYPE_IQ1_S: {
        qblock_iq1_s *x = block;
        x->d = c->d;
        for (int k = 0; k < 8; k++) {
            unsigned h = (unsigned)c->scale[2 * k] << 12 | (c->shift[4 * k] < 0 ? 0x8000u : 0);
            for (int l = 0; l < 4; l++) {
                x->qs[4 * k + l] = (uint8_t)c->entry[4 * k + l];
                h |= (unsigned)(c->entry[4 * k + l] >> 8) << (3 * l);
            }
            store_u16(x->qh + 2 * k, (uint16_t)h);
        }
        break;
    }
    case QTYPE_IQ1_M: {
        qblock_iq1_m *x = block;
        uint16_t words[4] = {0, 0, 0, 0};
        for (int k = 0; k < 8; k++) {
            words[k / 2] |= (uint16_t)((c->scale[2 * k] | c->scale[2 * k + 1] << 3) << (6 * (k % 2)));
            for (int h = 0; h < 2; h++) {
                unsigned byte = 0;
                for (int m = 0; m < 2; m++) {
                    int g = 4 * k + 2 * h + m;
                    unsigned nib = (unsigned)(c->entry[g] >> 8) | (c->shift[g] < 0 ? 8u : 0);
                    byte |= nib << (4 * m);
                }
                x->qh[2 * k + h] = (uint8_t)byte;
            }
            for (int l = 0; l < 4; l++)
                x->qs[4 * k + l] = (uint8_t)c->entry[4 * k + l];
        }
        for (int i = 0; i < 4; i++)
            store_u16(x->scales + 2 * i, (uint16_t)(words[i] | ((c->d >> (4 * i)) & 0xf) << 12));
        break;
    }
    default:
        break;
    }
}

void quant_iq_quantize(uint32_t t, const float *src, void *dst, int64_t nb)
{
    pthread_once(&nearest_once, nearest_init);
    size_t bytes = quant_traits_of(t)->block_bytes;
    iq_choice c;
    for (int64_t i = 0; i < nb; i++) {
        memset(&c, 0, sizeof c);
        quantize_super_block(t, src + (size_t)i * QB_256, &c);
        pack(t, &c, (uint8_t *)dst + (size_t)i * bytes);
    }
}
