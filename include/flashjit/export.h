/* FLASHJIT_API marks what libflashjit exports: the library builds with hidden visibility, so
 * nothing else (no internal detail:: symbol) is part of its ABI. */
#ifndef FLASHJIT_EXPORT_H
#define FLASHJIT_EXPORT_H

#if defined(_WIN32)
#define FLASHJIT_API
#else
#define FLASHJIT_API __attribute__((visibility("default")))
#endif

#endif
