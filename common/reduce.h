// The local reduction of a reduce-scatter, on the host. After the copy
// engines' all-to-all, a rank's staging buffer holds n chunks of `count`
// elements back to back: chunk s (element offset s * count) is rank s's
// contribution. ReduceChunks folds them into the rank's output. Called by
// the client library's host path (any thread; no state) and by the tests
// as the reference of the GPU kernels (kernels/reduce.h), which give the
// same bits.
//
// Numerics (the same on every run, backend and timing):
//   out[i] = R(x_0[i] + x_1[i] + ... + x_{n-1}[i]), summed strictly in
//   chunk order 0, 1, ..., n-1.
//   - float16, bfloat16: each element widened exactly to float32, summed in
//     float32 (acc = x_0; acc = acc + x_1; ...); AVG then acc = acc / (float)n
//     (an IEEE division, not a multiplication by 1/n); rounded once to the
//     16-bit type, to nearest with ties to even (overflow to infinity,
//     subnormals rounded correctly).
//   - float32: summed in float32 in the same order; AVG divides by (float)n.
//   - float64: the same in float64, AVG by (double)n.
//   - Every NaN result is the positive quiet NaN without payload.
//   - uint8, int8, int32, int64: SUM only, wrapping (two's complement).
// common/reduce_numerics.h holds the element arithmetic shared with the
// kernels.
#pragma once

#include <cstdint>
#include <string>

namespace dmagather::common {

// dmagather_redop_t's values (client/include/dmagather/dmagather.h).
constexpr int kRedopSum = 0;
constexpr int kRedopAvg = 1;

// Whether ReduceChunks defines (dtype, redop): SUM for every dtype of
// common/dtype.h, AVG for the floating types. On false, *why (if not null)
// gets a sentence saying what is refused.
bool ReduceSupported(uint32_t dtype, int redop, std::string* why);

// out[0, count) = the reduction of the n chunks at `in` (n * count
// elements). Any alignment of `in` and `out`; `out` must not overlap `in`
// (the caller guarantees it). Preconditions: ReduceSupported(dtype, redop)
// and n >= 1; otherwise out is left untouched. The result does not depend
// on how the output is split into calls (each element is reduced alone).
void ReduceChunks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out);

// The same with chunk s at chunks[s] (n <= 64), as the client reduces: the
// other ranks' chunks in staging, its own in its send buffer. `out` may be
// one of the chunks exactly (in place: each block of the output is written
// after all its inputs were read), never a partial overlap.
void ReduceChunks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out);

}  // namespace dmagather::common
