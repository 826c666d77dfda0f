// LIFELINE_EXPORT marks what liblifeline.so exports: the public API in lib/include/lifeline/*.h.
// The library is built with hidden visibility, so everything else (lib/src, formats, the
// declared internal interface lifeline/internal/) stays inside it; Lifeline's own binaries and
// tests link those parts statically (CMake target lifeline_internal).
#ifndef LIFELINE_EXPORT_H_
#define LIFELINE_EXPORT_H_

// The standard attribute form in C++, so that it combines with [[nodiscard]] in any order.
#if defined(__cplusplus) && (defined(__GNUC__) || defined(__clang__))
#define LIFELINE_EXPORT [[gnu::visibility("default")]]
#elif defined(__GNUC__) || defined(__clang__)
#define LIFELINE_EXPORT __attribute__((visibility("default")))
#else
#define LIFELINE_EXPORT
#endif

#endif  // LIFELINE_EXPORT_H_
