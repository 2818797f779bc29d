/*
 * Check and decode many stored chunks in one call: the loop of
 * atari_zarr.storage.chunk_loop, loaded with ctypes (which releases the GIL for the
 * whole call, so threads decode at once).
 *
 * The loop uses no Python API: c-blosc2's blosc2_decompress_ctx and crc32c's
 * crc32c_value are passed in as function pointers, taken from the libraries
 * python-blosc2 and google-crc32c ship, so nothing is linked at build time. The file
 * is also an (empty) extension module, so that importing every module of the package
 * imports it too.
 */
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#else
#define EXPORT __attribute__((visibility("default")))
#endif

typedef int (*decompress_fn)(void *ctx, const void *src, int32_t srcsize, void *dest,
                             int32_t destsize);
typedef uint32_t (*crc_fn)(const uint8_t *data, size_t count);

/* What is wrong with a chunk, in status[i]; the caller names it. */
enum { OK = 0, TOO_SHORT = 1, BAD_CRC = 2, NOT_WHOLE = 3, WRONG_SIZE = 4, NO_DECODE = 5 };

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/*
 * Chunk i is srclen[i] bytes at address src[i]: a Blosc buffer, followed by its crc32c
 * (little-endian) when crc is not NULL. It decodes into destsize bytes at dest[i].
 * Returns the number of chunks not decoded; status[i] says why for each.
 */
EXPORT int64_t atari_zarr_decode_chunks(decompress_fn decompress, void *ctx, crc_fn crc,
                                        int64_t n, const uint64_t *src, const int64_t *srclen,
                                        const uint64_t *dest, int32_t destsize,
                                        int8_t *status) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)(uintptr_t)src[i];
        int64_t len = srclen[i];
        int8_t st = OK;
        if (s == NULL) {
            st = TOO_SHORT; /* not located: the caller reads it another way */
        } else if (crc != NULL) {
            if (len < 20) {
                st = TOO_SHORT;
            } else if (crc(s, (size_t)(len - 4)) != le32(s + len - 4)) {
                st = BAD_CRC;
            }
            len -= 4;
        } else if (len < 16) {
            st = TOO_SHORT;
        }
        if (st == OK && (int64_t)le32(s + 12) != len) {
            st = NOT_WHOLE;
        }
        if (st == OK && (int32_t)le32(s + 4) != destsize) {
            st = WRONG_SIZE;
        }
        if (st == OK && len > INT32_MAX) {
            st = NOT_WHOLE;
        }
        if (st == OK &&
            decompress(ctx, s, (int32_t)len, (void *)(uintptr_t)dest[i], destsize) != destsize) {
            st = NO_DECODE;
        }
        status[i] = st;
        bad += st != OK;
    }
    return bad;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_chunk_loop",
    "The compiled chunk loop; atari_zarr.storage.chunk_loop calls it through ctypes.",
    0,
    NULL,
};

PyMODINIT_FUNC PyInit__chunk_loop(void) { return PyModule_Create(&module); }
